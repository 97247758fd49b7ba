"""Add bytecode to a zipapp so the ramdisk's Python does not compile it at every boot.

    python3.11 initramfs/pyc.py IN.pyz OUT.pyz

zipimport never writes a bytecode cache: without .pyc entries every start compiles the agent
and its vendored protobuf from source, which costs tens of seconds under emulation. Each
``x.py`` entry gets an ``x.pyc`` beside it (unchecked hash-based, so the fixed 1980 timestamps
do not matter), compiled by the interpreter that runs this script: run it with the ramdisk's
own python3.11 (the builder does, in a chroot). That includes ``__main__.py``: runpy finds
``__main__.pyc`` first, and the archive's ``__file__`` then ends in ``.pyc`` (the bootstrap
only takes its directory, the archive). Standard library only.
"""

import importlib.util
import sys
import zipfile


def add_bytecode(src: str, dst: str) -> int:
    with open(src, "rb") as f:
        data = f.read()
    start = data.find(b"PK\x03\x04")
    prefix = data[:start] if start > 0 else b""
    added = 0
    with zipfile.ZipFile(src) as zin, open(dst, "wb") as out:
        out.write(prefix)
        with zipfile.ZipFile(out, "w") as zout:
            names = set(zin.namelist())
            for info in zin.infolist():
                body = zin.read(info)
                zout.writestr(info, body)
                pyc = info.filename + "c"
                if not info.filename.endswith(".py") or pyc in names:
                    continue
                code = compile(body, info.filename, "exec", dont_inherit=True, optimize=0)
                source_hash = importlib.util.source_hash(body)
                blob = importlib._bootstrap_external._code_to_hash_pyc(  # type: ignore[attr-defined]  # private: no stub
                    code, source_hash, False)
                pinfo = zipfile.ZipInfo(pyc, date_time=info.date_time)
                pinfo.external_attr = info.external_attr
                pinfo.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(pinfo, blob, compresslevel=9)
                added += 1
    return added


if __name__ == "__main__":
    n = add_bytecode(sys.argv[1], sys.argv[2])
    print(f"{sys.argv[2]}: {n} modules precompiled")
