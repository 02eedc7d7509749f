# Two commands do all the set-up on a fresh machine with Python >= 3.10:
#   make demo   install, then examples/demo.py: the relay on configs/demo.toml, block by block (under demo/)
#   make test   install, then lint (make lint), run the commands on other library versions, and the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint install bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy baton
	$(BIN)/lint-imports

# The suite, with the commands on the library versions users have (tests/compat: the lowest declared versions,
# a notebook image's set, no extras; each a virtual environment built once into .compat/) started first.
test: lint
	$(BIN)/python -m pytest -q --compat -n auto --maxprocesses 4

clean:
	rm -rf runs store data/tiny .compat
