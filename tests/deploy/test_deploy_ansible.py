"""The Ansible role against the same loopback sshd devices and real daemons."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cuvil_edge

PLAYBOOK = Path(cuvil_edge.__file__).parent / "deploy/ansible/deploy.yml"
ANSIBLE = Path(sys.executable).with_name("ansible-playbook")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible-core not installed (pip install -e .[dev])"),
]


def _inventory(lab, path: Path, devices) -> Path:
    lines = ["[devices]"]
    for dev in devices:
        a = lab.address(dev)
        lines.append(
            f"{dev.name} ansible_host=127.0.0.1 ansible_port={dev.port} ansible_user=root "
            f"ansible_ssh_private_key_file={a.identity} cuvil_edge_root={a.root} cuvil_edge_store={a.store} "
            f"cuvil_edge_daemon_url=http://127.0.0.1:{a.daemon_port}"
        )
    lines += [
        "[devices:vars]",
        f"ansible_python_interpreter={sys.executable}",
        f"cuvil_edge_python={sys.executable}",
        f"ansible_ssh_common_args='-o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes'",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _play(lab, inv: Path, bundle: Path, pub: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update({
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_LOCAL_TEMP": str(lab.workdir / "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": str(lab.workdir / "ansible-remote"),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    })
    cmd = [str(ANSIBLE), "-i", str(inv), str(PLAYBOOK), "-e", f"cuvil_edge_bundle={bundle}",
           "-e", f"cuvil_edge_pub={pub}", "-e", f"cuvil_edge_cli={Path(sys.executable).with_name('cuvil-edge')}",
           *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_ansible_role_deploys_gates_and_rolls_back(lab, bundles, deploy_keys, tmp_path):
    if not Path(sys.executable).with_name("cuvil-edge").exists():
        pytest.fail("the cuvil-edge console script is missing: pip install -e .")
    devs = [lab.device("dev0"), lab.device("dev1")]
    inv = _inventory(lab, tmp_path / "hosts.ini", devs)
    pub = deploy_keys["public"]
    dev0 = devs[0]

    r = _play(lab, inv, bundles["v1"], pub, "--limit", "dev0")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert os.readlink(dev0.store / "bundles/digits/current") == "1.0.0"
    assert lab.daemons["dev0"].get("/v2/models/digits/versions/1.0.0/ready")[0] == 200
    state = json.loads((dev0.store / "deploy/state/digits.json").read_text())
    assert state["versions"]["1.0.0"]["healthy"] is True
    assert oct((dev0.store / "bundles/digits/1.0.0").stat().st_mode & 0o777) == "0o755"

    # A bundle that fails its health gate on the canary: it switches back and the play stops,
    # so dev1 (second batch) is never touched.
    r = _play(lab, inv, bundles["bad_health"], pub)
    assert r.returncode != 0
    assert "health gate failed for digits 2.0.0" in r.stdout
    assert "switched back to 1.0.0; 1.0.0 serves and passes its health gate" in r.stdout
    assert os.readlink(dev0.store / "bundles/digits/current") == "1.0.0"
    assert lab.daemons["dev0"].get("/v2/models/digits/versions/1.0.0/ready")[0] == 200
    assert not (devs[1].store / "bundles/digits").exists()
    state = json.loads((dev0.store / "deploy/state/digits.json").read_text())
    assert state["events"][-1]["event"] == "rollback" and state["pending"] is None
    assert state["outcome"]["status"] == "rolled-back" and state["outcome"]["serving"] == "1.0.0"
    assert not (dev0.store / "deploy/lock").exists()

    # The same bundle again: nothing staged, nothing switched.
    r = _play(lab, inv, bundles["v1"], pub, "--limit", "dev0")
    assert r.returncode == 0
    assert "changed=0" in r.stdout.split("PLAY RECAP")[-1]


def test_ansible_role_refuses_wrong_architecture_and_bad_signature(lab, bundles, deploy_keys, tmp_path):
    from deploy_harness import fake_board

    dev = lab.device("arm0", daemon=False)
    fake_board(dev.root, "aarch64")
    inv = _inventory(lab, tmp_path / "hosts.ini", [dev])
    r = _play(lab, inv, bundles["v1"], deploy_keys["public"])
    assert r.returncode != 0 and "built for x86_64" in r.stdout and "the device is aarch64" in r.stdout
    r = _play(lab, inv, bundles["v1"], deploy_keys["other_public"])
    assert r.returncode != 0 and "wrong key" in r.stdout
    assert not (dev.store / "deploy").exists()
    shutil.rmtree(lab.workdir / "ansible-local", ignore_errors=True)
