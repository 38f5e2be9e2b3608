#!/usr/bin/python3
"""Wraps a root file system tar into an OCI image archive of one
uncompressed layer, which `podman load` imports with no registry and names
NAME. scripts/image uses it rather than `podman import`, which stamps the
image with the time of the import: here every field comes from the
arguments, so one commit's root file system (mmdebstrap's tar, sorted and
clamped to SOURCE_DATE_EPOCH) always gives the same image ID, the digest of
the config, which is printed.

  oci_archive.py ROOTFS.TAR OUT.TAR --name NAME --created EPOCH --arch ARCH
                 --user UID:GID [--workdir PATH] [--label K=V]...
"""
import argparse
import datetime
import hashlib
import io
import json
import sys
import tarfile


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def labels(items):
    out = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            sys.exit(f"oci_archive.py: --label '{kv}' is not K=V")
        out[k] = v
    return out


class Archive:
    """The OCI layout written as a tar, every entry root's and dated
    `created`."""

    def __init__(self, path, created):
        self.tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT)
        self.created = created

    def info(self, name, size):
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode = size, self.created, 0o644
        return ti

    def add_bytes(self, name, data):
        self.tar.addfile(self.info(name, len(data)), io.BytesIO(data))

    def add_blob(self, data):
        """A JSON blob; returns its descriptor's digest and size."""
        hexd = hashlib.sha256(data).hexdigest()
        self.add_bytes("blobs/sha256/" + hexd, data)
        return "sha256:" + hexd, len(data)

    def add_file(self, name, path, size):
        with open(path, "rb") as f:
            self.tar.addfile(self.info(name, size), f)

    def close(self):
        self.tar.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rootfs")
    ap.add_argument("out")
    ap.add_argument("--name", required=True)
    ap.add_argument("--created", type=int, required=True)
    ap.add_argument("--arch", required=True)
    ap.add_argument("--user", required=True)
    ap.add_argument("--workdir", default="/")
    ap.add_argument("--label", action="append", default=[])
    a = ap.parse_args()

    layer_hex = sha256_file(a.rootfs)
    with open(a.rootfs, "rb") as f:
        layer_size = f.seek(0, 2)
    created = datetime.datetime.fromtimestamp(
        a.created, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "created": created,
        "architecture": a.arch,
        "os": "linux",
        "config": {
            "User": a.user,
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                    "/usr/bin:/sbin:/bin"],
            "WorkingDir": a.workdir,
            "Labels": labels(a.label),
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_hex]},
        "history": [{"created": created, "created_by": "scripts/image"}],
    }
    out = Archive(a.out, a.created)
    out.add_bytes("oci-layout", canonical({"imageLayoutVersion": "1.0.0"}))
    out.add_file("blobs/sha256/" + layer_hex, a.rootfs, layer_size)
    cfg_digest, cfg_size = out.add_blob(canonical(config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": cfg_digest,
            "size": cfg_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": "sha256:" + layer_hex,
            "size": layer_size,
        }],
    }
    man_digest, man_size = out.add_blob(canonical(manifest))
    out.add_bytes("index.json", canonical({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": man_digest,
            "size": man_size,
            "annotations": {"org.opencontainers.image.ref.name": a.name},
        }],
    }))
    out.close()
    print(cfg_digest)


if __name__ == "__main__":
    main()
