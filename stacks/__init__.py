"""lmstack's CDK app: settings, one construct per concern, the stack that wires them."""
