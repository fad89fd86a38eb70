"""The operator docs hold working material: YAML manifests that parse and
mean what the text says, config files rapidmount accepts, shell that parses."""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess

import pytest
import yaml

from rapidmount.daemon import cli, config

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _blocks(path: pathlib.Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", path.read_text(encoding="utf-8"), re.M | re.S)


def _manifests() -> list[dict]:
    documents = []
    for block in _blocks(DOCS / "gke.md", "yaml"):
        documents.extend(doc for doc in yaml.safe_load_all(block) if doc is not None)
    return documents


def _kind(kind: str) -> list[dict]:
    return [doc for doc in _manifests() if doc["kind"] == kind]


def test_gke_manifests_parse_and_name_themselves():
    kinds = [doc["kind"] for doc in _manifests()]
    for kind in ("Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "PodMonitoring", "Pod"):
        assert kind in kinds, f"docs/gke.md has no {kind}"
    for doc in _manifests():
        assert doc["apiVersion"] and doc["metadata"]["name"], doc


def test_gke_daemonset_mounts_with_bidirectional_propagation():
    (daemonset,) = _kind("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= \
        daemonset["spec"]["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts["mounts"]["mountPropagation"] == "Bidirectional"
    assert volumes["fuse"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert volumes[next(n for n, m in mounts.items() if m["mountPath"] == "/dev/fuse")]["hostPath"]["path"] \
        == "/dev/fuse"
    requests = container["resources"]["requests"]
    assert requests["memory"] and requests["cpu"]
    assert pod["terminationGracePeriodSeconds"] > 30  # longer than --retry-deadline: SIGTERM flushes
    # The command is rapidmount's own, with flags it accepts.
    command = container["args"][0].split("exec ", 1)[1].split()
    assert command[0] == "rapidmount"
    args = cli.build_parser().parse_args(command[1:])
    assert args.foreground and args.config_file == "/etc/rapidmount/rapidmount.toml"
    assert f"{volumes['config']['configMap']['name']}" == _kind("ConfigMap")[0]["metadata"]["name"]
    assert args.mountpoint.startswith(mounts["mounts"]["mountPath"] + "/")


def test_gke_config_map_is_a_valid_config_file(tmp_path):
    (config_map,) = _kind("ConfigMap")
    path = tmp_path / "rapidmount.toml"
    path.write_text(config_map["data"]["rapidmount.toml"])
    values = config.load_config_file(str(path))
    assert values["metadata_ttl"] == -1 and values["prometheus_port"] == 9101
    assert values["prometheus_address"] == "0.0.0.0"
    (daemonset,) = _kind("DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["ports"][0]["containerPort"] == values["prometheus_port"]
    # The memory request covers the byte budgets.
    memory = container["resources"]["requests"]["memory"]
    assert memory.endswith("Mi") and int(memory[:-2]) << 20 >= values["cache_size"] + values["metadata_cache_size"]


def test_gke_consumer_uses_host_to_container_propagation():
    (pod,) = _kind("Pod")
    (daemonset,) = _kind("DaemonSet")
    mount_dir = next(v["hostPath"]["path"] for v in daemonset["spec"]["template"]["spec"]["volumes"]
                     if v["name"] == "mounts")
    (container,) = pod["spec"]["containers"]
    assert container["volumeMounts"][0]["mountPropagation"] == "HostToContainer"
    assert pod["spec"]["volumes"][0]["hostPath"]["path"].startswith(mount_dir + "/")
    assert pod["spec"]["nodeSelector"].items() <= daemonset["spec"]["template"]["spec"]["nodeSelector"].items()
    (monitor,) = _kind("PodMonitoring")
    assert monitor["spec"]["selector"]["matchLabels"] == daemonset["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("doc", ["gke.md", "configuration.md"])
def test_shell_blocks_parse(doc, tmp_path):
    for index, block in enumerate(_blocks(DOCS / doc, "bash")):
        script = tmp_path / f"block{index}.sh"
        script.write_text(block)
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_gke_startup_script_flags_are_accepted():
    (script,) = _blocks(DOCS / "gke.md", "bash")
    options = re.search(r"^RAPIDMOUNT_OPTIONS=(.*)$", script, re.M).group(1).replace("${BUCKET}", "training-data")
    args = cli.build_parser().parse_args([*shlex.split(options), "training-data", "/mnt/x"])
    assert config.config_from_args(args).metadata_ttl == -1


def test_configuration_toml_examples_load(tmp_path):
    blocks = _blocks(DOCS / "configuration.md", "toml")
    assert blocks
    for index, block in enumerate(blocks):
        path = tmp_path / f"example{index}.toml"
        path.write_text(block)
        assert config.load_config_file(str(path))


def test_readme_links_every_doc():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for doc in sorted(DOCS.glob("*.md")):
        assert f"docs/{doc.name}" in readme, f"README.md does not link docs/{doc.name}"
    assert "make test" in readme and "make run" in readme


@pytest.mark.mount
def test_readme_tour_works(tmp_path):
    """The tour's shell commands on a mount of the demo bucket, then the
    README's official-client snippet reads the appended object back."""
    from rapidmount.daemon.demo import sample_objects
    from rapidmount.emulator import Emulator
    from tests.mountutil import mounted

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shell = next(block for block in re.findall(r"^```\n(.*?)^```$", readme, re.M | re.S) if "epoch 100" in block)
    (snippet,) = _blocks(ROOT / "README.md", "python")
    (tmp_path / "readback.py").write_text(snippet)
    with Emulator(buckets={"demo-bucket": "zonal"}) as emu:
        for name, data in sample_objects().items():
            emu.seed("demo-bucket", name, data, finalize=not name.startswith("logs/"))
        with mounted(emu.endpoint, "demo-bucket") as m:
            result = subprocess.run(["bash", "-e", "-c", shell.replace("/tmp/rapidmount-demo", str(m.path))],
                                    capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr
            assert result.stdout.endswith("epoch 100 done\n"), result.stdout
            import sys

            readback = subprocess.run([sys.executable, str(tmp_path / "readback.py"), emu.endpoint, "demo-bucket",
                                       "logs/train.log"], capture_output=True, timeout=60)
        assert readback.returncode == 0, readback.stderr
        assert readback.stdout.endswith(b"epoch 99 done\nepoch 100 done\n")
