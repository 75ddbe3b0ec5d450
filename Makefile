# hypeman.vgpu — developer entry points. Every target bootstraps what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
COLL := .collections/ansible_collections/hypeman/vgpu
VENV := $(CURDIR)/.venv

.PHONY: help bootstrap test sanity units integration lint changelog-lint build-smoke py312 pytest bench clean

help:
	@echo "make test     run every test (installs what it needs)"
	@echo "make sanity | units | integration [TARGET=name] | lint | changelog-lint | build-smoke | py312"
	@echo "make pytest   fast unit run with plain pytest (no ansible-test venv)"
	@echo "make bench    run the benchmarks in bench/"

bootstrap:
	@bash scripts/bootstrap.sh

test: bootstrap
	@bash scripts/test.sh all

sanity units integration lint changelog-lint build-smoke py312: bootstrap
	@bash scripts/test.sh $@

pytest: bootstrap
	@cd $(COLL) && PYTHONPATH=$(CURDIR)/.collections $(VENV)/bin/python -m pytest -q -n 2 $(or $(ARGS),tests/unit)

bench: bootstrap
	@for b in bench/*.py; do echo "== $$b"; PYTHONPATH=$(CURDIR)/.collections $(VENV)/bin/python $$b || exit 1; done

clean:
	rm -rf .collections build tests/output
