"""hil/targets.toml: the shipped file loads; every mistake is one line naming file, target, field."""

from __future__ import annotations

from pathlib import Path

import pytest

from hil.errors import TargetError
from hil.targets import TARGETS_FILE, get_hil_target, load_hil_targets


class TestShippedTargets:
    def test_every_kind_is_there(self) -> None:
        kinds = {t.kind for t in load_hil_targets(TARGETS_FILE).values()}
        assert kinds == {"local", "qemu-user", "qemu-system", "ssh"}

    def test_qemu_system_is_orins_cpu_stand_in(self) -> None:
        t = get_hil_target("qemu-system")
        assert (t.kind, t.cpu, t.board) == ("qemu-system", "cortex-a76", None)

    def test_personality_target_names_a_known_board(self) -> None:
        from hil.personality import PERSONALITIES

        t = get_hil_target("qemu-orin-nano")
        assert t.board in PERSONALITIES
        assert t.mem_mb >= 6000  # the probe picks the 8GB variant from MemTotal

    def test_ssh_template_falls_back_to_qemu_system(self) -> None:
        t = get_hil_target("ssh-example")
        assert (t.kind, t.fallback) == ("ssh", "qemu-system")

    def test_qemu_user_cpus_are_known_models(self) -> None:
        from hil.qemu_user import CPU_MODELS

        assert set(get_hil_target("qemu-user").cpus) <= {m.name for m in CPU_MODELS}


@pytest.mark.parametrize(("body", "message"), [
    ('[target.a]\nkind = "vm"\n', "target.a.kind: 'vm' is not one of"),
    ('[target.a]\nkind = "qemu-system"\nmem = 2\n', "target.a.mem: unknown field"),
    ('[target.a]\nkind = "qemu-system"\nmem_mb = "2G"\n', "target.a.mem_mb: '2G' has the wrong type"),
    ('[target.a]\nkind = "local"\ncpu = "max"\n', "target.a.cpu: not a field of kind 'local'"),
    ('[target.a]\nkind = "ssh"\nport = 22\n', "target.a.host: an ssh target needs"),
    ('[target.a]\nkind = "ssh"\nhost = "b"\nfallback = "c"\n', "no target named 'c'"),
    ('[target.a]\nkind = "qemu-system"\nboard = "orin-nano-9gb"\n', "target.a.board:"),
    ('[target.a\n', "not valid TOML"),
    ('x = 1\n', "no [target.NAME] tables"),
])
def test_bad_targets_file_is_one_clear_error(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "targets.toml"
    path.write_text(body)
    with pytest.raises(TargetError) as err:
        load_hil_targets(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(TargetError, match="unknown HIL target 'nope'; known: local, "):
        get_hil_target("nope")
