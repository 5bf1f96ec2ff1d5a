"""The deploy commands end to end through ``cuvil-edge`` against loopback devices."""

from __future__ import annotations

import json
import os

import pytest

from cuvil_edge.cli import main


def _device_args(lab, dev):
    a = lab.address(dev)
    return ["--to", f"root@127.0.0.1:{dev.port}", "--identity", a.identity, "--known-hosts", a.known_hosts,
            "--root", a.root, "--store", a.store, "--daemon-port", str(a.daemon_port)]


class TestDeployCommands:
    def test_deploy_status_rollback(self, lab, bundles, deploy_keys, tmp_path, capsys):
        dev = lab.device("dev0")
        args = _device_args(lab, dev)
        pub = str(deploy_keys["public"])
        report = tmp_path / "report.json"
        assert main(["deploy", str(bundles["v1"]), "--pub", pub, *args, "--report", str(report)]) == 0
        assert main(["deploy", str(bundles["v2"]), "--pub", pub, *args]) == 0
        out = capsys.readouterr().out
        assert "PASSED" in out and "deployed" in out
        data = json.loads(report.read_text())
        assert data["ok"] and data["devices"][0]["status"] == "deployed"
        assert data["devices"][0]["bytes_sent"] == bundles["v1"].stat().st_size

        assert main(["status", *args, "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        model = status[0]["models"][0]
        assert (model["current"], model["previous"], model["ready"]) == ("1.1.0", "1.0.0", True)
        assert status[0]["daemon"] == "ready" and status[0]["facts"]["arch"] == "x86_64"

        assert main(["rollback", "digits", *args]) == 0
        assert "rolled back" in capsys.readouterr().out
        assert os.readlink(dev.store / "bundles/digits/current") == "1.0.0"

    def test_deploy_refuses_without_key_or_with_wrong_key(self, lab, bundles, deploy_keys, capsys):
        dev = lab.device("dev0", daemon=False)
        args = _device_args(lab, dev)
        assert main(["deploy", str(bundles["v1"]), *args]) == 1
        assert "--pub" in capsys.readouterr().err
        assert main(["deploy", str(bundles["v1"]), "--pub", str(deploy_keys["other_public"]), *args]) == 1
        assert "wrong key" in capsys.readouterr().err
        assert not (dev.store / "deploy").exists()

    def test_failed_device_exits_1_with_table(self, lab, bundles, deploy_keys, capsys):
        dev = lab.device("dev0")
        args = _device_args(lab, dev)
        assert main(["deploy", str(bundles["bad_health"]), "--pub", str(deploy_keys["public"]), *args,
                     "--health-timeout", "10"]) == 1
        out = capsys.readouterr().out
        assert "rolled-back" in out and "FAILED" in out

    def test_install_daemon(self, lab, capsys):
        dev = lab.device("dev0", daemon=False)
        a = lab.address(dev)
        args = ["--to", f"root@127.0.0.1:{dev.port}", "--identity", a.identity, "--known-hosts", a.known_hosts,
                "--root", a.root]
        # The unit's ExecStart must exist on the board (a unit pointing nowhere fails at boot).
        assert main(["install-daemon", *args]) == 1
        assert "/usr/local/bin/cuvil-edged, which is not on the board" in capsys.readouterr().out
        (dev.root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
        (dev.root / "usr/local/bin/cuvil-edged").write_text("#!/bin/sh\n")
        assert main(["install-daemon", *args]) == 0
        unit = dev.root / "etc/systemd/system/cuvil-edged.service"
        from cuvil_edge.deploy.install import default_unit, wanted_by

        assert unit.read_bytes() == default_unit()
        for target in wanted_by(default_unit()):
            link = dev.root / f"etc/systemd/system/{target}.wants/cuvil-edged.service"
            assert os.readlink(link) == "/etc/systemd/system/cuvil-edged.service"
        assert "installed" in capsys.readouterr().out
        assert main(["install-daemon", *args, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["status"] == "unchanged"
        dropin = dev.root / "etc/systemd/system/cuvil-edged.service.d/jtop.conf"
        assert not dropin.exists()  # no jtop group on this board: a drop-in naming it would fail the unit
        (dev.root / "etc/group").write_text("root:x:0:\nvideo:x:44:\njtop:x:998:\n")
        assert main(["install-daemon", *args, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["status"] == "installed"
        assert "SupplementaryGroups=jtop" in dropin.read_text()
        (dev.root / "etc/group").write_text("root:x:0:\nvideo:x:44:\n")  # jetson-stats removed
        assert main(["install-daemon", *args, "--json"]) == 0
        assert not dropin.exists()


def test_install_daemon_custom_unit_and_bad_unit(lab, tmp_path, capsys):
    dev = lab.device("dev0", daemon=False)
    a = lab.address(dev)
    args = ["--to", f"root@127.0.0.1:{dev.port}", "--identity", a.identity, "--known-hosts", a.known_hosts,
            "--root", a.root]
    unit = tmp_path / "cuvil-edged.service"
    (dev.root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (dev.root / "usr/bin/cuvil-edged").write_text("#!/bin/sh\n")
    unit.write_text("[Unit]\nDescription=x\n[Service]\nExecStart=/usr/bin/cuvil-edged\n"
                    "[Install]\nWantedBy=multi-user.target graphical.target\n")
    assert main(["install-daemon", *args, "--unit", str(unit)]) == 0
    for target in ("multi-user.target", "graphical.target"):
        assert (dev.root / f"etc/systemd/system/{target}.wants/cuvil-edged.service").is_symlink()
    unit.write_text("[Unit]\nDescription=x\n[Service]\nExecStart=/usr/bin/cuvil-edged\n")
    assert main(["install-daemon", *args, "--unit", str(unit)]) == 1
    assert "WantedBy" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["deploy", "rollback", "status", "install-daemon"])
def test_help(cmd, capsys):
    assert main([cmd, "--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_deploy_console_through_a_cut_link_is_quiet(lab, bundles, deploy_keys, tmp_path):
    """``cuvil-edge deploy`` as a user runs it, its link cut during the gate and back 2 s later: one
    line per state change, the table, PASSED; no tracebacks, no repeated asyncio/asyncssh lines."""
    import asyncio
    import sys

    from deploy_harness import LinkProxy

    dev = lab.device("dev0")
    a = lab.address(dev)
    pub = str(deploy_keys["public"])
    assert main(["deploy", str(bundles["v1"]), "--pub", pub, *_device_args(lab, dev)]) == 0
    flag, reached = dev.pause_dir / "gate.pause", dev.pause_dir / "gate.reached"
    flag.touch()

    async def run() -> tuple[int, str, str]:
        proxy = LinkProxy(dev.port)
        await proxy.start()
        with open(lab.known_hosts, "a") as f:
            f.write(f"[127.0.0.1]:{proxy.port} {dev.host_pub}\n")
        args = ["--to", f"root@127.0.0.1:{proxy.port}", "--identity", a.identity, "--known-hosts", a.known_hosts,
                "--root", a.root, "--store", a.store, "--daemon-port", str(a.daemon_port)]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cuvil_edge.cli", "deploy", str(bundles["padded"]), "--pub", pub, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
        try:
            end = asyncio.get_running_loop().time() + 120
            while not reached.exists():
                assert asyncio.get_running_loop().time() < end, "the device step never reached the gate"
                await asyncio.sleep(0.05)
            proxy.cut()
            flag.unlink()
            await asyncio.sleep(2.0)
            proxy.heal()
            out, err = await asyncio.wait_for(proc.communicate(), 180)
            return proc.returncode or 0, out.decode(), err.decode()
        finally:
            flag.unlink(missing_ok=True)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await proxy.close()

    from cuvil_edge.deploy.transport import run_sync

    code, out, err = run_sync(run())
    assert code == 0, out + err
    text = out + err
    for noise in ("Traceback", "socket.send()", "Task exception", "asyncssh"):
        assert noise not in text, text
    lines = [ln for ln in out.splitlines() if ln.startswith("root@127.0.0.1:")]
    assert [ln.split(": ", 1)[1].split()[0] for ln in lines] == ["probe", "upload", "extract", "activate", "link",
                                                                "deployed"], out
    assert "PASSED" in out and os.readlink(dev.store / "bundles/digits/current") == "1.5.0"


def test_install_daemon_from_host_wheels_into_a_venv(lab, tmp_path, capsys):
    """Offline: the host's wheel goes into a venv that sees the system site-packages; the unit runs it."""
    from hil.project import build_wheel  # the wheel the HIL rig puts on the emulated board

    wheels = tmp_path / "wheels"
    build_wheel(wheels)
    dev = lab.device("dev0", daemon=False)
    a = lab.address(dev)
    args = ["--to", f"root@127.0.0.1:{dev.port}", "--identity", a.identity, "--known-hosts", a.known_hosts,
            "--root", a.root, "--wheels", str(wheels), "--no-deps", "--json"]
    assert main(["install-daemon", *args]) == 0
    out = json.loads(capsys.readouterr().out)[0]
    assert (out["status"], out["venv"], out["exec_start"]) == ("installed", "/opt/cuvil-edge/venv",
                                                               "/opt/cuvil-edge/venv/bin/cuvil-edged")
    venv = dev.root / "opt/cuvil-edge/venv"
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    assert (venv / "bin/cuvil-edged").is_file()
    unit = (dev.root / "etc/systemd/system/cuvil-edged.service").read_text()
    assert "ExecStart=/opt/cuvil-edge/venv/bin/cuvil-edged --store /var/lib/cuvil-edge" in unit
    assert out["tensorrt"] == "absent"  # no TensorRT on this machine; on a Jetson the system's is seen
    assert not (dev.root / "opt/cuvil-edge/venv.wheels").exists()


def test_sudo_refusals_are_one_line():
    from cuvil_edge.deploy.install import sudo_message, with_exec_start

    msg = sudo_message("nano-1", "sudo: a password is required\n")
    assert "\n" not in msg and msg.startswith("nano-1: sudo needs a password")
    other = sudo_message("nano-1", "user is not in the sudoers file.  This incident will be reported.\n")
    assert "cannot use sudo" in other and "\n" not in other
    assert with_exec_start(b"[Service]\nExecStart=/usr/local/bin/cuvil-edged --port 1\n", "/v/bin/cuvil-edged") == \
        b"[Service]\nExecStart=/v/bin/cuvil-edged --port 1\n"


def test_venv_install_runs_the_root_recover_step_from_the_venv_too():
    from cuvil_edge.deploy.install import default_unit, with_exec_start

    unit = with_exec_start(default_unit(), "/opt/cuvil-edge/venv/bin/cuvil-edged").decode()
    assert "ExecStartPre=-+/opt/cuvil-edge/venv/bin/cuvil-edge-device recover --store /var/lib/cuvil-edge\n" in unit
    assert "/usr/local/bin/" not in unit
