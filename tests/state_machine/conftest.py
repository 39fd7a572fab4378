from state_machine.harness import deployment, jobs, make_deployment, parsed_once, waits  # noqa: F401
