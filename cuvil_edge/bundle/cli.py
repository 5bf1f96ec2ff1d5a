"""``cuvil-edge keygen | sign | verify``: keys and signatures for bundles."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]


def keygen(
    out: Path = typer.Option(None, "--out", help="Directory for cuvil.key and cuvil.pub. Defaults to ~/.config/cuvil-edge/keys."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing keys."),
) -> None:
    """Write an Ed25519 key pair that the stock minisign tool accepts (secret key mode 0600)."""
    from cuvil_edge._console import console
    from cuvil_edge.bundle.signing import default_key_paths, generate_keypair

    sk, pk = (out / "cuvil.key", out / "cuvil.pub") if out else default_key_paths()
    public = generate_keypair(sk, pk, overwrite=force)
    console.print(f"key {public.key_id_hex}: secret [bold]{sk}[/], public [bold]{pk}[/]")
    console.print(f"verify a manifest with: minisign -V -p {pk} -m manifest.json")


def sign(
    bundle: Path = typer.Argument(..., help="Bundle (.cvb) to re-sign in place."),
    key: Path = typer.Option(None, "--key", help="Secret key. Defaults to the default key."),
) -> None:
    """Re-sign a bundle's manifest with another key; the payload is checked first and kept byte for byte."""
    from cuvil_edge._console import console
    from cuvil_edge.bundle.resign import resign_bundle

    manifest = resign_bundle(bundle, key)
    console.print(f"signed {bundle} ({manifest.name} {manifest.version}) with key {manifest.key_id}")


def verify(
    bundle: Path = typer.Argument(..., help="Bundle file (.cvb) or extracted bundle directory."),
    pub: Path = typer.Option(None, "--pub", help="Public key; without it only integrity is checked."),
) -> None:
    """Check a bundle's checksums, members and (with --pub) its signature. Exits 1 on any failure."""
    from cuvil_edge._console import console
    from cuvil_edge.bundle import verify_bundle, verify_directory

    manifest = verify_directory(bundle, pub) if bundle.is_dir() else verify_bundle(bundle, pub)
    what = "signature and checksums" if pub else "checksums (signature NOT checked: pass --pub)"
    console.print(
        f"[green]PASSED[/] {bundle}: {manifest.name} {manifest.version} for {manifest.target_name} "
        f"({manifest.precision}, {len(manifest.files)} members): {what} OK"
    )


def register(app: typer.Typer) -> None:
    app.command("keygen")(keygen)
    app.command("sign")(sign)
    app.command("verify")(verify)
