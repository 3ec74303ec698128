# The README's two commands are `make book` and `make test`; everything else builds on them.
PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV))/bin
# nbgrader shells out to alembic and the kernels resolve `python` on PATH: both must be the venv's.
export PATH := $(BIN):$(PATH)
CHAPTERS := $(notdir $(wildcard solutions/[0-9]*))

.PHONY: venv book book-instructor books lab lab-instructor proxy a11y hub lint check check-gpu test release grade bench train demo clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	# The environment is the learners': nbgrader's instructor parts (formgrader, Create Assignment, course
	# list) are off; `make lab-instructor` and the hub's instructor account turn them on (jupyter/instructor/).
	$(BIN)/jupyter labextension disable --level=sys_prefix @jupyter/nbgrader:formgrader \
		@jupyter/nbgrader:course-list @jupyter/nbgrader:create-assignment
	$(BIN)/jupyter server extension disable --sys-prefix nbgrader.server_extensions.formgrader \
		nbgrader.server_extensions.course_list
	touch $@

## Build the book to _build/html (chapter code executed and cached, warnings are errors).
book: venv
	$(BIN)/jupyter-book build book --path-output . --config _config.yml -W -n --keep-going

## The instructor edition, with the solved notebooks, in its own folder: _build/instructor/_build/html.
book-instructor: venv
	$(BIN)/jupyter-book build book --path-output _build/instructor --config _config.yml \
		--toc $(abspath book/_toc_instructor.yml) -W -n --keep-going

## JupyterLab for learners: the notebooks, the checks, and nbgrader's learner parts (Assignment List, Validate).
lab: venv
	$(BIN)/jupyter lab

## JupyterLab for the instructor: the learners' parts and nbgrader's instructor tools (formgrader, Create Assignment).
lab-instructor: venv
	JUPYTER_CONFIG_PATH=$(abspath jupyter/instructor) $(BIN)/jupyter lab

## The proxy JupyterHub runs in front of the hub (configurable-http-proxy, pinned in hub/package-lock.json).
HUB_PROXY := hub/node_modules/.bin/configurable-http-proxy
proxy: $(HUB_PROXY)

$(HUB_PROXY): hub/package.json hub/package-lock.json
	npm ci --prefix hub --no-audit --no-fund
	touch $@

## axe-core, which the accessibility test injects into every page of the book (pinned in a11y/package-lock.json).
AXE := a11y/node_modules/axe-core/axe.min.js
a11y: $(AXE)

$(AXE): a11y/package.json a11y/package-lock.json
	npm ci --prefix a11y --no-audit --no-fund
	touch $@

## A local JupyterHub for the course: an instructor and learners, nbgrader's exchange; Ctrl-C stops it and
## removes everything it made. Run as root (it creates the accounts). Options in ARGS, e.g. ARGS="--port 8001".
hub: venv proxy
	$(BIN)/python -m autograde_tests.hub --proxy $(abspath $(HUB_PROXY)) $(ARGS)

## The linter: ruff (pinned in requirements.txt, configured in pyproject.toml).
lint: venv
	$(BIN)/ruff check autograde_tests tests

## The tiers (markers in pyproject.toml): the slow ones grade in a sandbox, read the built book, drive Chromium
## or run nbgrader's own autograde and make bench's smoke run; `make check` is everything else, the fast tier
## (the reference, the checks and their mistakes, the wire, the grader's units, the notebooks against their
## release), a few minutes on two cores with no book build. Test modules are spread over one worker per core; a
## module and its fixtures stay on one worker.
SLOW_TIERS := sandbox or book or browser or slow
PYTEST := $(BIN)/python -m pytest -n auto --dist loadscope
check: venv
	$(PYTEST) -m "not ($(SLOW_TIERS) or cuda)"

## The GPU tier: the reference against PyTorch, every check's visible and hidden cases, and one chapter graded in
## the sandbox, on the GPU (TF32 off); each test skipped with one line where PyTorch sees no GPU.
check-gpu: venv
	@if $(BIN)/python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
		$(BIN)/python -m pytest -m cuda -p no:randomly; \
	else echo "make check-gpu: skipped, PyTorch sees no CUDA device on this machine"; fi

## The whole suite: the lint first, then the fast tier beside both editions of the book (a build executes the
## chapters one at a time, on one core: the fast tier takes the other), the hub's proxy and axe-core where npm is
## (the tests that need them are skipped where it is not), then the slow tiers, which read the built pages.
test: lint
	$(MAKE) --no-print-directory --output-sync=target -j2 check books $(if $(shell command -v npm),proxy a11y)
	$(PYTEST) -m "$(SLOW_TIERS) or cuda"

## Both editions, one after the other: they share the execution cache, so the second executes nothing.
books: book
	$(MAKE) --no-print-directory book-instructor

## Write the solutions' answers from the reference and their metadata as JupyterLab saves it, then regenerate
## notebooks/ (the learners' release) with nbgrader.
release: venv
	$(BIN)/python -m autograde_tests.authoring.solution_regions
	$(BIN)/python -m autograde_tests.authoring.notebook_form
	for a in $(CHAPTERS); do $(BIN)/nbgrader generate_assignment "$$a" --force || exit 1; done

## Grade a class: submitted/<student>/<chapter>/ -> gradebook, autograded/, feedback/, grades.csv, reports/.
## Options go in ARGS, e.g. make grade ARGS="--jobs 4 --chapter 01_attention".
grade: venv
	$(BIN)/python -m autograde_tests.grading $(ARGS)

## Measure the course's speed against PyTorch and the floor; writes book/benchmarks_measured.md (the appendix page includes it).
## Figure 6 (generation with and without the KV cache) also writes book/_static/06_decoder_only/generation_speed.json;
## ARGS="--figures 6" measures it alone (under a minute).
## Figures 1-10 take about 1.5 hours on 2 cores; ARGS="--no-builds" skips figure 5 (make book, make test),
## ARGS="--figures 7" measures only attention at scale (chapter 7's figures; a few minutes).
## ARGS="--figures 8" measures only the times the notebooks promise (a few minutes); ARGS="--figures 10" only chapter 8's
## byte-level BPE, the reference against tiktoken and Hugging Face's tokenizers (a few minutes).
bench: venv
	$(BIN)/python -m autograde_tests.authoring.bench $(ARGS)

## Train chapter 5's Transformer on the toy task, Post-LN then Pre-LN, then three runs of the paper's recipe (recipe/), then chapter 6's language model on
## Shakespeare, one character per token and then one byte-level BPE token of chapter 8 (vocabulary of 512), a few minutes
## each on a CPU; writes the cached runs the books plot, book/_static/05_transformer/*.json,
## book/_static/06_decoder_only/shakespeare.json and book/_static/08_tokens/bpe_run.json (then `make clean book` redraws
## the pages: the execution cache notices changed code, not changed data).
train: venv
	$(BIN)/python -m autograde_tests.authoring.training --out book/_static/05_transformer/post_ln.json
	$(BIN)/python -m autograde_tests.authoring.training --norm-first --out book/_static/05_transformer/pre_ln.json
	$(BIN)/python -m autograde_tests.authoring.training --schedule paper --out book/_static/05_transformer/recipe/paper_schedule.json
	$(BIN)/python -m autograde_tests.authoring.training --schedule paper --label-smoothing 0.1 --dropout 0.1 \
		--out book/_static/05_transformer/recipe/paper_recipe.json
	$(BIN)/python -m autograde_tests.authoring.training --label-smoothing 0.1 --dropout 0.1 \
		--out book/_static/05_transformer/recipe/cosine_smoothing_dropout.json
	$(BIN)/python -m autograde_tests.authoring.lm_training --out book/_static/06_decoder_only/shakespeare.json
	$(BIN)/python -m autograde_tests.authoring.lm_training --tokens bpe --vocab-size 512 --out book/_static/08_tokens/bpe_run.json

## Grade three scratch students end to end and show where their feedback went.
demo: venv
	$(BIN)/python -m autograde_tests.authoring.demo

clean:
	rm -rf _build
