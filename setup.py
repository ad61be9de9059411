"""Build hooks: compile protos/ (epp's own gRPC API) with grpcio-tools before building the package,
and the C extensions (the KV index's, epp/kvcache/*.c, the tokenizer's run rule,
epp/tokenize/_runs.c, the request body's join, epp/extproc/_join.c, and its JSON strings,
epp/api/_jsonstr.c; a C compiler and Python's
headers are needed to build epp, not to run it).

Everything else about the package is declared in pyproject.toml. The generated modules land in
epp/rpc/v1/ in the source tree, so regular and editable installs both find them; they are
git-ignored and regenerated on every build.
"""

from __future__ import annotations

import pathlib
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).parent.resolve()


def compile_protos() -> None:
    import grpc_tools
    from grpc_tools import protoc

    protos = ROOT / "protos"
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    for proto in sorted(protos.rglob("*.proto")):
        args = [
            "grpc_tools.protoc",
            f"-I{protos}",
            f"-I{well_known}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            str(proto.relative_to(protos)),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        compile_protos()
        super().run()

    def get_outputs(self, *args: Any, **kwargs: Any) -> list[str]:
        return list(super().get_outputs(*args, **kwargs))


# -O3 for the index's probe loops; C11 for the designated initialisers.
_C_FLAGS = [
    "-O3",
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Wno-missing-field-initializers",
    "-Wno-cast-function-type",
]

setup(
    cmdclass={"build_py": BuildPyWithProtos},
    ext_modules=[
        Extension(f"epp.{name}", [f"epp/{name.replace('.', '/')}.c"], extra_compile_args=_C_FLAGS)
        for name in ("kvcache._records", "kvcache._keys", "tokenize._runs", "extproc._join", "api._jsonstr")
    ],
)
