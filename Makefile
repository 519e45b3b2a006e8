# Two commands set up a fresh machine and run things:
#   make demo   - install what is missing, then run the main job (FORMAT=parquet|delta|iceberg, LAKE=local|s3)
#   make test   - install what is missing (also a headless browser), then lint and run the whole test suite
#   make bench  - install what is missing (also the go-liftbridge reference), then run the benchmarks
#   make fuzz   - the compiled decoder fuzzed against the pure-Python one for FUZZ_SECONDS (needs clang)
#   make soak   - reads, publishes and leader failovers on a 3-node cluster for MINUTES (10): RSS, fds, threads
#   make compat - the compatibility tier: the built wheel in a fresh environment per target (README, "Versions")
# Both are idempotent; the pieces below are reused by them.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS_BIN := .tools/bin
EXTRAS ?= dev,airflow,spark,iceberg
PYTEST_ARGS ?=
BENCH_ARGS ?=
SPARK_BENCH_ARGS ?=

CONSTRAINTS ?= constraints/newest.txt
COMPAT_TARGETS ?= airflow-3.1 airflow-3.2 pyspark-4.0 pyspark-4.2 python-3.12 python-3.13
# The Pythons the package supports (pyproject.toml's requires-python and classifiers): `make wheels` builds a wheel
# for each (tools/python-for.sh finds the interpreters).
PYTHON_VERSIONS ?= 3.11 3.12 3.13

.PHONY: setup bytecode venv tools golbbench browser proto native spark-classes lint test test-fast test-tier chaos bench soak demo dist wheel wheels compat fuzz clean

setup: venv tools proto native bytecode

# The project's own modules compiled to bytecode beside their sources. Python writes that cache itself when it
# imports a module, unless PYTHONDONTWRITEBYTECODE is set (as on this project's CI machines): then every process
# compiles what it imports from source again, and the suite starts hundreds of them (Spark's Python workers,
# Airflow commands, triggerers): about 0.15 CPU-s each (docs/benchmarks.md). compileall writes the cache whatever
# that variable says and rewrites only what changed; .gitignore and the packed environment leave it out.
bytecode: venv proto
	@$(PY) -m compileall -q -j 0 liftbridge_provider pyspark_liftbridge spark_jobs dags tests tools bench >/dev/null

# The virtual environment, with the project installed in editable mode. "compat" mode puts the
# project folder on sys.path (a .pth line) instead of an import hook, so Spark's data source
# discovery (pkgutil.iter_modules) finds pyspark_liftbridge from any working directory.
# The exact versions come from $(CONSTRAINTS) (constraints/newest.txt; pyproject.toml only has ranges).
venv: $(VENV)/.installed $(VENV)/.pyspark-site
$(VENV)/.installed: pyproject.toml setup.py $(CONSTRAINTS)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python 3.11+ is required, found " + sys.version)'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]' -c $(CONSTRAINTS) --config-settings editable_mode=compat
	@# apache-airflow-providers-apache-spark pulls pyspark-client (4.2.0), whose Python files overwrite
	@# pyspark's. The provider works either way (the compat tier installs without this); the full suite
	@# runs on PySpark 4.3's own files, so reinstall them last (docs/troubleshooting.md).
	$(PY) -m pip install --quiet --force-reinstall --no-deps "pyspark==$$($(PY) -c 'import importlib.metadata as m; print(m.version("pyspark"))')"
	@# The build leaves airflow_provider_liftbridge.egg-info in the project folder, which compat mode puts on
	@# sys.path: Python would see the distribution twice, and Airflow load its plugin entry point twice (a
	@# warning and an import error; in task processes the entry-point plugins after the second copy are skipped).
	rm -rf airflow_provider_liftbridge.egg-info
	touch $@

# Spark puts its pyspark.zip and py4j's zip first on the path of every Python process it starts, and Python
# compiles what it loads from a zip anew in each process (about 0.7 s of CPU per Spark Python daemon). A .pth line
# in site-packages drops the two zips when they hold what is installed here, so Spark's Python processes of this
# environment load the same modules from site-packages' cached bytecode (tools/venv/_pyspark_from_site_packages.py).
$(VENV)/.pyspark-site: $(VENV)/.installed tools/venv/_pyspark_from_site_packages.py tools/venv/pyspark-from-site-packages.pth
	purelib="$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" && \
		cp tools/venv/_pyspark_from_site_packages.py tools/venv/pyspark-from-site-packages.pth "$$purelib" && \
		$(PY) -m compileall -q "$$purelib/_pyspark_from_site_packages.py" >/dev/null
	touch $@

# The pinned Liftbridge and NATS servers and the S3 gateway (versitygw), built with `go install` into .tools/bin,
# and the jars Spark's S3A needs, fetched by Maven into .tools/jars/s3a (docs/spark.md, "Object storage"),
# and those of Iceberg's reference REST catalog the Iceberg tests on S3 run (.tools/jars/iceberg-rest, 29 MB).
# Each step is a no-op when what it installs is there at the pinned version. Cold: the gateway about 3.5
# minutes (Go caches empty), the jars about 20 s (Maven's local repository empty).
tools:
	@tools/install-servers.sh
	@tools/install-s3-server.sh
	@tools/install-s3a-jars.sh
	@tools/install-iceberg-rest-jars.sh

# The go-liftbridge reference program of `make bench` (tools/golbbench, pinned in its go.mod), built into
# .tools/bin. Not part of setup: the consumer group interop tests build it themselves when they run.
golbbench:
	@tools/install-golbbench.sh

# Headless Chromium and chromedriver (Debian packages) for the Airflow UI test.
browser:
	@tools/install-browser.sh

# The compiled decoder of the Subscribe stream (liftbridge_provider/client/_wire_columns.c), built in place
# again when its source changes (the editable install builds it once; a wheel always carries it).
NATIVE_SRC := liftbridge_provider/client/_wire_columns.c
native: $(VENV)/.native
$(VENV)/.native: $(VENV)/.installed $(NATIVE_SRC)
	$(PY) setup.py --quiet build_ext --inplace
	touch $@

# Coverage-guided fuzzing of the compiled decoder (tools/fuzz_wire_columns.py says how): libFuzzer with
# AddressSanitizer and UBSan, its input compared with the pure-Python decoder's, for FUZZ_SECONDS; findings
# are left in .fuzz/wire_columns/. Needs clang (apt-get install clang). Not part of `make test`, which runs
# its deterministic share (tests/unit/test_wire_differential.py).
FUZZ_SECONDS ?= 600
fuzz: setup
	$(PY) tools/fuzz_wire_columns.py --seconds $(FUZZ_SECONDS)

# Python modules generated from proto/ (also done by the package build).
proto: $(VENV)/.installed
	@$(PY) tools/gen_proto.py --check >/dev/null 2>&1 || $(PY) tools/gen_proto.py

# The archive of Spark's classes the tests' Spark drivers map instead of loading each class again
# (tests/spark_classes.py): made once per environment by a small Spark job, about half a minute.
spark-classes: $(VENV)/spark-classes.jsa
$(VENV)/spark-classes.jsa: $(VENV)/.installed tests/spark_classes.py
	$(PY) -m tests.spark_classes

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The whole suite on TEST_WORKERS parallel pytest-xdist workers, a test file never split between two (its
# module fixtures stay one), the longest files first (tests/file_costs.py): most tests wait on servers and
# subprocesses, so four workers keep two CPUs busy (docs/benchmarks.md, "The test suite's time"; three left
# them idle 13% of the run). TEST_WORKERS=0 runs it in one process. The 25 slowest tests close the report:
# where the suite's time goes, run by run (the file order comes from tests/file_costs.json).
TEST_WORKERS ?= 4
test: setup browser spark-classes lint
	$(VENV)/bin/pytest -rs -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

# The unit tier alone (tests/unit: pure logic, no servers, no subprocesses): seconds. Each tier has its folder
# and marker (tests/conftest.py): `make test-tier TIER=server` (or unit, airflow, spark, system, chaos) runs one.
test-fast: venv proto native
	$(VENV)/bin/pytest -q -m unit tests/unit $(PYTEST_ARGS)

TIER ?= server
test-tier: setup browser spark-classes
	$(VENV)/bin/pytest -rs -m $(TIER) tests/$(TIER) $(PYTEST_ARGS)

# The randomized fault harness (tests/chaos, docs/reliability.md). `make test` runs its bounded CI part
# (2 seeds of 24 steps, at most 60 s of steps each); this runs SEEDS seeds from BASE with WALL seconds of steps
# each, or replays one with SEED=<n> (and the STEPS it printed). KEEP_GOING=1 lists every finding of a
# seed instead of stopping at the first.
SEEDS ?= 20
BASE ?= 1
STEPS ?= 24
WALL ?= 240
chaos: setup
	CHAOS_KEEP_GOING=$(KEEP_GOING) $(VENV)/bin/pytest tests/chaos -rfE --chaos-steps $(STEPS) --chaos-wall-clock $(WALL) \
		$(if $(SEED),--chaos-seed $(SEED),--chaos-seeds $(SEEDS) --chaos-base-seed $(BASE)) $(PYTEST_ARGS)

# The benchmarks (bench/README.md): the client next to go-liftbridge and gufo-liftbridge, with a chart of that
# run in docs/benchmarks-client.png, the read paths' CPU per message next to go's, then the Spark source and the
# lake. Numbers only, no assertions on time; about 10 minutes on 2 CPUs. Options go through BENCH_ARGS
# (bench_client.py) and SPARK_BENCH_ARGS (bench_spark.py).
bench: setup golbbench
	$(PY) bench/bench_client.py --chart docs/benchmarks-client.png $(BENCH_ARGS)
	$(PY) bench/bench_read_cpu.py --rounds 3 --no-python-decoder
	$(PY) bench/bench_spark.py $(SPARK_BENCH_ARGS)
	$(PY) bench/bench_lake_history.py
	$(PY) bench/bench_lake_partitions.py

# The soak of issue 49 (bench/README.md, "bench_soak.py"): one client process doing sync publishes, batches over
# gRPC and NATS, bounded reads, left subscriptions, Spark slice reads, cursor and metadata calls on a 3-node
# cluster for MINUTES minutes, the partition leader killed or frozen every minute; its RSS, fds and threads after
# a 2-minute warm-up, with their slopes. Not part of `make bench`: 10 minutes by default.
MINUTES ?= 10
soak: setup
	$(PY) bench/bench_soak.py --minutes $(MINUTES)

# FORMAT=parquet (default), delta or iceberg: the lake the example DAG ingests into. LAKE=local (default: a
# folder of out/) or s3: the lake in a bucket of Versity's S3 gateway, started on 127.0.0.1 for the demo, with
# Airflow's aws connection pointing at it (tools/demo.py; README, "The two commands").
FORMAT ?= parquet
LAKE ?= local
demo: setup
	$(PY) tools/demo.py --format $(FORMAT) --lake $(LAKE)

# What Spark executors need (this package, grpcio, protobuf, pyarrow, nats-py), packed with venv-pack into
# dist/liftbridge-spark-env.tar.gz for spark-submit --archives (docs/spark.md, "On a cluster").
dist:
	@tools/pack-env.sh

# The package as users install it: dist/airflow_provider_liftbridge-<version>-cp3XY-cp3XY-<platform>.whl, tagged
# for one Python and platform as it carries the compiled decoder (built without a C compiler, it has none).
# `make wheel` builds it for the virtual environment's Python; `make wheels` for each of PYTHON_VERSIONS
# (3.11, 3.12, 3.13), each with its own interpreter, which is what the compatibility tier installs.
WHEEL_CLEAN := rm -rf dist/airflow_provider_liftbridge-*.whl build/lib* build/bdist.* airflow_provider_liftbridge.egg-info
wheel: $(VENV)/.installed
	@# build/lib would carry modules deleted since the last build into the wheel.
	$(WHEEL_CLEAN)
	$(PY) -m pip wheel --quiet --no-deps . -w dist
	@# The build leaves the egg-info in the project folder (see $(VENV)/.installed): gone, or the editable
	@# install would show the distribution twice to the next `make test`.
	rm -rf airflow_provider_liftbridge.egg-info

wheels: $(VENV)/.installed
	$(WHEEL_CLEAN)
	@for version in $(PYTHON_VERSIONS); do \
		python="$$(tools/python-for.sh $$version)" || exit 1; \
		echo "$$python -m pip wheel --quiet --no-deps . -w dist"; \
		"$$python" -m pip wheel --quiet --disable-pip-version-check --no-deps . -w dist || exit 1; \
	done
	rm -rf airflow_provider_liftbridge.egg-info
	@ls dist/airflow_provider_liftbridge-*.whl

# The compatibility tier: for each of COMPAT_TARGETS, tools/compat.sh makes .compat/<target> anew, installs the
# wheel built for the target's Python with its extras and constraints/<target>.txt, and runs tests/compat against
# real servers (one pytest session per target). Every target runs; the exit status says whether any failed.
compat: tools wheels
	@failed=""; for target in $(COMPAT_TARGETS); do tools/compat.sh $$target || failed="$$failed $$target"; done; \
	if [ -n "$$failed" ]; then echo "compat tier failed:$$failed"; exit 1; fi

clean:
	rm -rf $(VENV) .tools .devserver .compat .fuzz liftbridge_provider/_proto build dist *.egg-info
	rm -f liftbridge_provider/client/_wire_columns.*.so
