"""Resumable, verified upload: a cut link resumes, a corrupted file is never used."""

from __future__ import annotations

import dataclasses
import os

import pytest
from deploy_harness import CuttingProxy

from cuvil_edge.deploy.device import deploy_device, prepare_bundle
from cuvil_edge.deploy.transport import SSHTransport, run_sync
from cuvil_edge.deploy.upload import CorruptUpload, file_sha256, upload_resumable


class TestResumableUpload:
    def test_connection_cut_mid_upload_then_resumed(self, lab, bundles, deploy_keys):
        dev = lab.device("dev0")
        addr = lab.address(dev)
        b = prepare_bundle(bundles["padded"], deploy_keys["public"])
        assert b.size > 10 << 20

        async def cut_run():
            proxy = CuttingProxy(dev.port, limit=b.size * 3 // 4)
            await proxy.start()
            with open(lab.known_hosts, "a") as f:
                f.write(f"[127.0.0.1]:{proxy.port} {dev.host_pub}\n")
            try:
                return await deploy_device(b, dataclasses.replace(addr, port=proxy.port)), proxy
            finally:
                await proxy.close()

        first, proxy = run_sync(cut_run())
        assert proxy.cut
        assert first.status == "unreachable" and first.stage == "upload"
        part = dev.store / "deploy/uploads" / f"{b.sha256}.cvb.part"
        partial = part.stat().st_size
        assert 0 < partial < b.size
        assert not (dev.store / "bundles/digits/current").exists()

        second = run_sync(deploy_device(b, addr))
        assert second.status == "deployed", second.reason
        assert 0 < second.resumed_from <= partial
        assert second.bytes_sent == b.size - second.resumed_from
        assert not part.exists()
        assert os.readlink(dev.store / "bundles/digits/current") == "1.5.0"

    def test_corrupted_upload_rejected(self, lab, bundles, deploy_keys):
        """Bytes changed on the device during the upload fail the device's sha256 check."""
        dev = lab.device("dev0")
        addr = lab.address(dev)
        b = prepare_bundle(bundles["padded"], deploy_keys["public"])
        part = dev.store / "deploy/uploads" / f"{b.sha256}.cvb.part"

        def corrupt(device, stage, done, total):
            if stage == "upload" and done >= 4 << 20 and part.exists():
                with open(part, "r+b") as f:
                    f.seek(1000)
                    f.write(b"\xde\xad\xbe\xef")

        r = run_sync(deploy_device(b, addr, progress=corrupt))
        assert r.status == "failed"
        assert "corrupted upload rejected" in r.reason
        assert not part.exists()
        assert not (dev.store / "bundles/digits").exists()

        again = run_sync(deploy_device(b, addr))
        assert again.status == "deployed" and again.bytes_sent == b.size

    def test_mismatched_partial_file_restarts(self, lab, bundles, deploy_keys):
        dev = lab.device("dev0")
        b = prepare_bundle(bundles["padded"], deploy_keys["public"])
        uploads = dev.store / "deploy/uploads"
        uploads.mkdir(parents=True)
        (uploads / f"{b.sha256}.cvb.part").write_bytes(os.urandom(5 << 20))
        r = run_sync(deploy_device(b, lab.address(dev)))
        assert r.status == "deployed", r.reason
        assert r.bytes_sent == b.size and r.resumed_from == 0
        assert any("did not match" in n for n in r.notes)

    def test_upload_resumable_skips_verified_file(self, lab, tmp_path):
        dev = lab.device("dev0", daemon=False)
        src = tmp_path / "blob.bin"
        src.write_bytes(os.urandom(3 << 20))
        sha = file_sha256(src)
        dest = str(dev.store / "x" / "blob.bin")

        async def twice():
            async with SSHTransport(lab.address(dev)) as tr:
                a = await upload_resumable(tr, src, dest, sha, segment=1 << 20)
                b = await upload_resumable(tr, src, dest, sha, segment=1 << 20)
                with pytest.raises(CorruptUpload):
                    await upload_resumable(tr, src, dest + ".2", "0" * 64, segment=1 << 20)
                return a, b

        a, b = run_sync(twice())
        assert a.sent == 3 << 20 and not a.skipped
        assert b.sent == 0 and b.skipped
        assert (dev.store / "x/blob.bin").read_bytes() == src.read_bytes()
        assert not (dev.store / "x/blob.bin.2.part").exists()
