"""Nothing in the image that only the control plane uses: every top-level name of a module under
training_image/lm is used by the image itself (its entry points and modules, read with `ast`:
tests/architecture/names.py). A name only controlplane/, stacks/, lmstack/ or the tests read belongs in
the control plane: in the image, editing it would change the build context of every training image and
rebuild them all. What both sides must agree on (hyperparameter names and defaults, channel names,
container paths) stays in `lm.spec`, because the runtime reads it."""
import names


def describe(found):
    return "\n".join("%s.%s, used by %s" % (module, name, ", ".join(where[:3]) + (" ..." if len(where) > 3 else ""))
                     for (module, name), where in found.items())


def test_every_name_in_the_image_is_used_by_the_image():
    found = names.Index().not_used_by_the_image()
    assert found == {}, ("top-level names under training_image/lm the image does not use (move what the control "
                         "plane reads to controlplane/, delete the rest):\n" + describe(found))


def test_the_scan_sees_names_only_the_control_plane_reads(tmp_path):
    """The check above can fail: a planted image module whose URI function and account only a planted
    control-plane module reads, and a constant nobody reads, are reported; its names the image reads
    (from its own top-level statements) are not."""
    planted = tmp_path / "planted.py"
    planted.write_text('ACCOUNT = "1"\n\n\ndef uri(region):\n    return ACCOUNT + region\n\n\n'
                       'SHARED = "/opt/ml/model"\nUNUSED = 5\n\n\ndef model_dir():\n    return SHARED\n\n\n'
                       'print(model_dir())\n')
    reader = tmp_path / "reader.py"
    reader.write_text("from lm.spec import planted\n\nURI = planted.uri('us-east-1')\n")
    modules = dict(names.imports.module_files(), **{"lm.spec.planted": str(planted),
                                                    "controlplane.planted_reader": str(reader)})
    found = {key: where for key, where in names.Index(modules).not_used_by_the_image().items()
             if key[0] == "lm.spec.planted"}
    reader_line = "%s:3" % names.os.path.relpath(str(reader), names.imports.ROOT)
    assert {name: where for (_, name), where in found.items()} == {
        "ACCOUNT": ["only lm.spec.planted.uri"], "UNUSED": ["nothing"], "uri": [reader_line]}, describe(found)
