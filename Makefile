# hypeman.vgpu — developer entry points. Every target bootstraps what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
COLL := .collections/ansible_collections/hypeman/vgpu
VENV := $(CURDIR)/.venv

.PHONY: help bootstrap demo test sanity units integration lint changelog-lint build-smoke py312 molecule pytest bench clean

help:
	@echo "make demo     run the collection against a simulated vGPU host and print the report"
	@echo "make test     run every test (installs what it needs)"
	@echo "make sanity | units | integration [TARGET=name] | lint | changelog-lint | build-smoke | py312"
	@echo "make molecule [SCENARIO=name]  molecule scenarios on the simulated host"
	@echo "make pytest [ARGS=...]  fast plain-pytest run of the unit tests"
	@echo "make bench    run the benchmarks in bench/"

bootstrap:
	@bash scripts/bootstrap.sh

demo: bootstrap
	@bash scripts/demo.sh

test: bootstrap
	@bash scripts/test.sh all

sanity units integration lint changelog-lint build-smoke py312: bootstrap
	@bash scripts/test.sh $@

molecule: bootstrap
	@bash scripts/molecule.sh $(SCENARIO)

pytest: bootstrap
	@cd $(COLL) && PYTHONPATH=$(CURDIR)/.collections $(VENV)/bin/python -m pytest -q -n 2 $(or $(ARGS),tests/unit)

bench: bootstrap
	@for b in bench/*.py; do echo "== $$b"; PYTHONPATH=$(CURDIR)/.collections $(VENV)/bin/python $$b || exit 1; done

clean:
	rm -rf .collections .mnt build tests/output
