# hypeman.vgpu — developer entry points. Every target bootstraps what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
COLL := .collections/ansible_collections/hypeman/vgpu
VENV := $(CURDIR)/.venv

.PHONY: help bootstrap demo test sanity units integration lint changelog-lint build-smoke py312 molecule pytest fuzz bench clean

help:
	@echo "make demo     run the collection against a simulated vGPU host and print the report"
	@echo "make test     run every test (installs what it needs)"
	@echo "make sanity | units | integration [TARGET=name] | lint | changelog-lint | build-smoke | py312"
	@echo "make molecule [SCENARIO=name]  molecule scenarios on the simulated host"
	@echo "make pytest [ARGS=...]  fast plain-pytest run of the unit tests"
	@echo "make fuzz     the property-based (hypothesis) tests with the long fuzz profile"
	@echo "make bench    run the benchmarks in bench/"

bootstrap:
	@bash scripts/bootstrap.sh

demo: bootstrap
	@bash scripts/demo.sh

# The image for molecule builds during bootstrap, beside the venvs; VGPU_TEST_TOOLS
# adds what only the tests use (Java and ansible-rulebook for the EDA run, Chromium).
test:
	@VGPU_PREBUILD_IMAGE=1 VGPU_TEST_TOOLS=1 bash scripts/bootstrap.sh
	@bash scripts/test.sh all

sanity units integration lint changelog-lint build-smoke py312: bootstrap
	@bash scripts/test.sh $@

molecule: bootstrap
	@bash scripts/molecule.sh $(SCENARIO)

# Module-side and controller-side tests run in separate processes, as ansible-test
# units runs them: importing controller code reroutes module warnings.
PYTEST := cd $(COLL) && PYTHONPATH=$(CURDIR)/.collections $(VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2
pytest: bootstrap
ifdef ARGS
	@$(PYTEST) $(ARGS)
else
	@$(PYTEST) tests/unit/plugins/modules tests/unit/plugins/module_utils tests/unit/sim
	@$(PYTEST) tests/unit/plugins/filter tests/unit/plugins/plugin_utils tests/unit/extensions
endif

# The hypothesis tests with HYPOTHESIS_PROFILE=fuzz (many random examples instead of the
# quick, derandomized ones `make test` runs); module and controller sides apart, as above.
FUZZ_GROUPS := "tests/unit/plugins/modules tests/unit/plugins/module_utils tests/unit/sim" \
	"tests/unit/plugins/filter tests/unit/plugins/plugin_utils tests/unit/extensions"
fuzz: bootstrap
	@cd $(COLL) && for dirs in $(FUZZ_GROUPS); do \
	  files=$$(grep -rlE --include='test_*.py' '^(from|import) hypothesis' $$dirs 2>/dev/null); \
	  [ -z "$$files" ] || HYPOTHESIS_PROFILE=fuzz PYTHONPATH=$(CURDIR)/.collections \
	    $(VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2 $$files || exit 1; \
	done

bench: bootstrap
	@for b in bench/*.py; do echo "== $$b"; PYTHONPATH=$(CURDIR)/.collections $(VENV)/bin/python $$b || exit 1; done

clean:
	rm -rf .collections .mnt build tests/output
