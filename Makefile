# rapidmount: `make run` tries the mount on the embedded emulator; `make test`
# sets everything up and runs the test suite. Both work on a fresh machine.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_PACKAGES := fuse3 libfuse3-dev libjemalloc2 pkg-config rsync systemd
BUCKET ?= demo-bucket
MOUNTPOINT ?= /tmp/rapidmount-demo

.PHONY: run test lint bench soak soak-long protos install system-deps venv clean

# Install the system packages pyfuse3 needs to build and mount, only if missing.
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml | system-deps
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,dev,ml]"
	@touch $(STAMP)

venv: system-deps $(STAMP)

run: venv
	$(VENV)/bin/python -m rapidmount.daemon.demo --bucket $(BUCKET) --mountpoint $(MOUNTPOINT)

test: venv
	$(PY) -m pytest -q

# Static checks (the rules are in pyproject.toml): ruff, then mypy's types; CI runs them too.
lint: venv
	$(VENV)/bin/ruff check rapidmount tests
	$(VENV)/bin/mypy

# Every benchmark (about an hour), then docs/benchmarks.json updated and docs/benchmarks.png drawn.
bench: venv
	$(PY) tests/bench/run_all.py

# The reliability checks at their long sizes, one summary line per check
# (make test runs the same checks at short sizes).
soak: venv
	RAPIDMOUNT_SOAK=1 RAPIDMOUNT_HOSTILE_NAMES=10000 $(PY) -m pytest -q -p no:cacheprovider tests/reliability \
	  tests/mount/test_hostile_names.py tests/mount/test_redirection.py

# R4 (64 busy handles) for an hour: each process's memory after warm-up, and
# every stream closed at the end. Not part of make soak.
soak-long: venv
	RAPIDMOUNT_SOAK=1 RAPIDMOUNT_R4_SECONDS=3600 $(PY) -m pytest -q -p no:cacheprovider \
	  tests/reliability/test_r4_many_handles.py

# Put the commands where systemd units and mount(8) (`-t rapidmount`) find them.
install: venv
	ln -sf $(CURDIR)/$(VENV)/bin/rapidmount /usr/local/bin/rapidmount
	ln -sf $(CURDIR)/$(VENV)/bin/rapidmount-emulator /usr/local/bin/rapidmount-emulator
	ln -sf $(CURDIR)/$(VENV)/bin/mount.rapidmount /sbin/mount.rapidmount

protos: venv
	$(PY) -m rapidmount._proto.generate

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
