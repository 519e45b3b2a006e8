"""Coverage-guided fuzzing of the compiled column builder against its pure-Python twin, for a bounded time.

    .venv/bin/python tools/fuzz_wire_columns.py --seconds 600      # `make fuzz FUZZ_SECONDS=600`
    .venv/bin/python tools/fuzz_wire_columns.py --replay FILE      # one input again (a crash's artifact)
    .venv/bin/python tools/fuzz_wire_columns.py --coverage         # the decoder's lines the corpus reaches

Builds tools/fuzz/wire_columns_fuzzer.c with clang (libFuzzer, AddressSanitizer, UndefinedBehaviorSanitizer)
into .fuzz/, the decoder's C source compiled into it, and runs it on the corpus in .fuzz/wire_columns/corpus
(kept between runs), seeded with messages serialized by protobuf, scripts of several messages and windows
(tests/unit/wire_cases.py says how an input is read) and hand-written edge cases. Every input goes through
tests/unit/wire_cases.check: both builders must give the same answers, errors and buffers; a difference, a
sanitizer report, a leak of the decoder's memory or a hang stops the run and leaves the input in
.fuzz/wire_columns/ (crash-*, timeout-*, leak-*). Needs clang (Debian: apt-get install clang) and a Python
built with a shared libpython. Not part of `make test`: tests/unit/test_wire_differential.py is its
bounded, deterministic share.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.unit import wire_cases as w  # noqa: E402 - after the checkout is on sys.path

WORK = ROOT / ".fuzz" / "wire_columns"
BINARY = ROOT / ".fuzz" / "wire_columns_fuzzer"
HARNESS = ROOT / "tools" / "fuzz" / "wire_columns_fuzzer.c"
DECODER = ROOT / "liftbridge_provider" / "client" / "_wire_columns.c"
SANITIZERS = "fuzzer,address,undefined"


def build(clang: str, binary: Path = BINARY, flags: tuple[str, ...] = ()) -> None:
    """The fuzzer program, built again when the harness or the decoder changed."""
    if binary.exists() and binary.stat().st_mtime > max(HARNESS.stat().st_mtime, DECODER.stat().st_mtime):
        return
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        sys.exit("this Python has no shared libpython to embed in the fuzzer")
    libdir = sysconfig.get_config_var("LIBDIR")
    library = sysconfig.get_config_var("LDLIBRARY").removeprefix("lib").removesuffix(".so")
    binary.parent.mkdir(parents=True, exist_ok=True)
    command = [
        clang,
        "-g",
        "-O1",
        "-std=c99",
        *(flags or (f"-fsanitize={SANITIZERS}", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer")),
        f"-I{sysconfig.get_paths()['include']}",
        str(HARNESS),
        f"-L{libdir}",
        f"-l{library}",
        f"-Wl,-rpath,{libdir}",
        "-o",
        str(binary),
    ]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)


def seeds() -> list[bytes]:
    """The starting inputs: serialized messages, scripts of them, and edge cases of the wire format."""
    chance = random.Random(7)
    messages = w.sample_messages(chance, 200)
    edges = [
        b"",
        w.field(1, w.INT64_MAX) + w.field(4, w.INT64_MIN),
        w.group(99, w.field(1, 5) + w.group(98)) + w.field(1, 3),
        w.entry(b"a", b"1") + w.field(9, w.field(1, b"b") + w.field(3, 1)) + w.entry(b"a", b"2"),
        w.field(9, w.field(1, b"\xff") + w.field(1, b"ok")),
        bytes([0x88, 0x80, 0x80, 0x80, 0x10, 0x05]),
        w.field(7, "日本".encode()) + w.field(11, b"\xf4\x8f\xbf\xbf"),
        b"".join(w.entry(bytes([c]), b"v") for c in range(0x7A, 0x60, -1)),
    ]
    scripts = [w.script(chance, messages + edges) for _ in range(100)]
    return messages + edges + scripts


def dictionary() -> str:
    """Tokens for libFuzzer's mutations: every tag of Message and of a header entry, groups, long varints."""
    tokens = [w.tag(n, t) for n in range(1, 13) for t in (0, 1, 2, 5)] + [w.tag(n, 3) for n in (3, 9, 99)]
    tokens += [w.tag(n, 4) for n in (3, 9, 99)] + [w.varint(-1), w.varint(w.INT64_MAX), b"\xff\xff\xff\xff\x0f"]
    tokens += [bytes([w.WINDOW_STEP])]
    return "".join('"' + "".join(f"\\x{b:02x}" for b in token) + '"\n' for token in tokens)


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FUZZ_PYTHON=sys.executable,
        PYTHONPATH=str(ROOT),
        PYTHONMALLOC="malloc",  # every Python object on the sanitizer's heap
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",  # leaks: the harness counts
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
    )
    return env


def coverage(clang: str) -> None:
    """Runs the corpus once through a build with clang's source coverage and prints the decoder's report."""
    binary, profile = BINARY.with_name("wire_columns_coverage"), WORK / "coverage.profraw"
    build(clang, binary, ("-fsanitize=fuzzer", "-fprofile-instr-generate", "-fcoverage-mapping"))
    env = environment() | {"LLVM_PROFILE_FILE": str(profile)}
    folders = [str(f) for f in (WORK / "corpus", WORK / "seeds") if f.is_dir()]
    subprocess.run([str(binary), "-runs=0", *folders], env=env, check=True, capture_output=True)
    version = clang.removeprefix("clang")  # clang-14 goes with llvm-profdata-14
    merged = WORK / "coverage.profdata"
    subprocess.run([f"llvm-profdata{version}", "merge", "-o", str(merged), str(profile)], check=True)
    report = [f"llvm-cov{version}", "report", str(binary), f"-instr-profile={merged}", str(DECODER)]
    subprocess.run(report, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=600, help="stop after this long (default 600)")
    parser.add_argument("--replay", type=Path, help="run this one input and stop")
    parser.add_argument("--coverage", action="store_true", help="report the decoder's coverage by the corpus")
    parser.add_argument("--clang", default=os.environ.get("CLANG", "clang"))
    parser.add_argument("libfuzzer_args", nargs="*", help="passed on to libFuzzer (after --)")
    args = parser.parse_args()
    if shutil.which(args.clang) is None:
        sys.exit(f"{args.clang} not found (Debian: apt-get install clang)")
    if args.coverage:
        coverage(args.clang)
        return
    build(args.clang)
    if args.replay is not None:
        run = [str(BINARY), str(args.replay)]
    else:
        corpus, seed_dir = WORK / "corpus", WORK / "seeds"
        for folder in (corpus, seed_dir):
            folder.mkdir(parents=True, exist_ok=True)
        for number, data in enumerate(seeds()):
            (seed_dir / f"seed-{number:04d}").write_bytes(data)
        (WORK / "tokens.dict").write_text(dictionary())
        run = [
            str(BINARY),
            str(corpus),
            str(seed_dir),
            f"-max_total_time={args.seconds}",
            "-max_len=2048",
            "-timeout=20",
            "-rss_limit_mb=4096",
            f"-dict={WORK / 'tokens.dict'}",
            f"-artifact_prefix={WORK}/",
            "-print_final_stats=1",
            *args.libfuzzer_args,
        ]
    print(" ".join(run), flush=True)
    sys.exit(subprocess.run(run, env=environment(), check=False).returncode)


if __name__ == "__main__":
    main()
