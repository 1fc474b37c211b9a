# Two commands do all the setup on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint fmt bench bench-peers wheel clean browser promtool nftables

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	KEEP=$(KEEP) $(BIN)/python -m kovanex.demo

# The dashboard tests (tests/test_ui_browser.py) drive Debian's chromium through
# chromedriver. Install both when we can (root with apt); otherwise those tests skip and
# say why. Never fails the build: no browser is a skip, not an error.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium and chromium-driver for the dashboard tests"; \
	  (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1)) || \
	  echo "could not install chromium: the browser tests will skip"; \
	else echo "no chromium and not root with apt: the browser tests will skip"; fi

# `promtool check metrics` (tests/test_metrics_events.py) comes from Debian's
# prometheus package; installed the same way, and its test skips when it is missing.
promtool:
	@if command -v promtool >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing prometheus (for promtool) for the metrics tests"; \
	  (apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
	   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1)) || \
	  echo "could not install prometheus: the promtool tests will skip"; \
	else echo "no promtool and not root with apt: the promtool tests will skip"; fi

# A unit's network policy (ADR 0076) is nftables rules on its uid; the tests in
# tests/test_network_policy.py need `nft`. Installed like the browser: root with apt, else
# those tests skip and say why (and the agent says the policy is NOT enforced).
nftables:
	@if [ -x /usr/sbin/nft ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing nftables for the unit network policy"; \
	  (apt-get install -y -q nftables >/dev/null 2>&1 || \
	   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q nftables >/dev/null 2>&1)) || \
	  echo "could not install nftables: the network policy tests will skip"; \
	else echo "no nft and not root with apt: the network policy tests will skip"; fi

# The suite's JUnit XML and every test's time (slowest first) land in $(TEST_REPORT);
# the slowest 25 are printed at the end, pass or fail (tests/durations.py).
TEST_REPORT := build/test-report
# pytest-xdist workers (ADR 0103): most tests wait on agents, gossip and deadlines rather
# than compute, so more workers than cores. One file per worker at a time (--dist loadfile):
# a module's fixtures are set up once, and its tests run in their written order.
# `make test TEST_WORKERS=0` runs the suite serially in one process.
TEST_WORKERS ?= 4

test: $(STAMP) browser promtool nftables
	$(BIN)/ruff check kovanex tests bench
	$(BIN)/ruff format --check kovanex tests bench
	@mkdir -p $(TEST_REPORT) && rm -f $(TEST_REPORT)/junit.xml
	$(BIN)/python -m pytest -q -x -n $(TEST_WORKERS) --dist loadfile \
	  --junitxml=$(TEST_REPORT)/junit.xml; rc=$$?; \
	  $(BIN)/python -m tests.durations $(TEST_REPORT)/junit.xml --top 25 \
	    --out $(TEST_REPORT)/durations.txt; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check --fix kovanex tests bench
	$(BIN)/ruff format kovanex tests bench

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

# Kovanex beside celery (redis) and huey (SQLite): the `bench` extra, and Debian's
# redis-server (apt, as root) when it is missing
bench-peers: $(STAMP)
	$(BIN)/pip install -q -e '.[test,bench]'
	command -v redis-server >/dev/null || { apt-get update -q && apt-get install -y -q redis-server; }
	$(BIN)/python -m bench.peer_bench

wheel: $(STAMP)  # dist/kovanex-*.whl, with hooks/ and templates/ inside (ADR 0018)
	$(BIN)/pip wheel -q --no-deps -w dist .

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build dist *.egg-info
