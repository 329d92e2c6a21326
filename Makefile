# Every target sets itself up: a venv under .venv, created once, reused through a stamp file.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROFILE ?= full
DOMAINS ?=
METHODS ?=
SEEDS ?=
VALUES ?=
DATASETS ?=
EXECUTOR ?= ray
ENGINE ?= auto
PRECISION ?= 32-true
CHECKPOINT_EVERY ?= 1
EVAL_EVERY ?=
PARTICIPATION ?=
CLIENT_MEMORY ?=
SPREAD ?=
ACTOR_RESTARTS ?= 3
PARALLEL ?=
GPUS_PER_ACTOR ?= 0
DRIVER_GPUS ?= 0
DRY_RUN ?=
# make test: pytest-xdist processes, each running whole test modules (most of a test runs on 1 CPU thread)
TEST_WORKERS ?= 2
export RAY_USAGE_STATS_ENABLED ?= 0

TABLES := table1 table2 table3 table-fedproto table-fedplvm table-fedapc table-all
.PHONY: setup demo test test-quick bench data $(TABLES) figures clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

## FedAvg vs FPL on Office-Caltech-10 through Ray on the CPU (7.5 min alone on 2 cores, 2026-11-23; README, Quick start)
demo: $(STAMP)
	$(PY) -m ray_jobs.demo

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

## the quick tier, for the inner loop: every module's tests but those marked slow (a minute or more each, or a
## module fixture that makes runs: tests/conftest.py's slow_setup); `make test` stays the whole suite and the CI
test-quick: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

## loop overhead, throughput and round phases; output saved under results/perf/
bench: $(STAMP)
	$(PY) -m ray_jobs.bench

## MNIST, USPS and SVHN through torchvision's downloaders into ./data (needs internet)
data: $(STAMP)
	$(PY) -m benchmark.download --root data

## a paper table (ray_jobs/tables.py): make table2 -> --table 2, make table-fedplvm -> --table fedplvm (FedPLVM's
## Tables 1-5, 7-12 and Figures 4, 5: the group fedplvm12, fedplvm3, fedplvm4, fedplvm5, fedplvm78, fedplvm9,
## fedplvm10, fedplvm11, fedplvm_t12, fedplvm_fig4a, fedplvm_fig4b, fedplvm_fig5);
## EXECUTOR=local: no Ray needed; PARALLEL=N: N runs at once (local: worker processes, default without a GPU as
## many as the cores hold at each run's threads at once, 4 on one; Ray: at most what the cluster fits);
## ENGINE=sequential|fused|auto;
## GPUS_PER_ACTOR=0.1 DRIVER_GPUS=0.1: Ray runs on the GPUs, fractions sharing one (several runs per GPU);
## PRECISION=32-true|bf16-mixed|auto (default 32-true, the tables' protocol; auto: bf16-mixed on a CPU with native
## bfloat16, else 32-true); CHECKPOINT_EVERY=10: each run's checkpoint every 10 rounds (docs/reliability.md);
## ACTOR_RESTARTS=0: a dying client actor stops its run (resumed by the next sweep), and actors send their clients'
## states (MOON, FedDyn) only for checkpoints, not every round;
## EVAL_EVERY=K: test every K-th round and the rounds the metric reads (default: the table's schedule, every 5th at full);
## PARTICIPATION=0.1: a tenth of the clients train in each round (drawn from the seed and round; default 1, all);
## CLIENT_MEMORY=host|disk|device: where client groups keep the clients not training (default auto; docs/scale.md);
## SPREAD=1: Ray places each run's client actors over as many nodes as possible;
## CUDNN_BENCHMARK=0: on CUDA, cuDNN's heuristic algorithms instead of the fastest timed ones (the default; not part
## of the protocol);
## METHODS=fedavg,fpl SEEDS=0 DATASETS=digits: run only part of the table (the report covers every
## complete run of it and says it is partial); VALUES=0.5,1: only these values of a grid's hyperparameter
## READINGS=1: make the table's readings of those rows instead of the rows (tables 2, fedapc: the runs the report's
## 'Readings of' sections read)
## DRY_RUN=1: list the runs it would make (and resume), after its checks; nothing runs, nothing is written
$(TABLES): $(STAMP)
	$(PY) -m ray_jobs.sweep --table $(patsubst -%,%,$(subst table,,$@)) --profile $(PROFILE) $(if $(DOMAINS),--domains $(DOMAINS)) \
		$(if $(METHODS),--methods $(METHODS)) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(DATASETS),--datasets $(DATASETS)) \
		$(if $(VALUES),--values $(VALUES)) $(if $(READINGS),--readings) \
		--executor $(EXECUTOR) $(if $(PARALLEL),--parallel $(PARALLEL)) --engine $(ENGINE) --precision $(PRECISION) \
		--checkpoint-every $(CHECKPOINT_EVERY) --actor-restarts $(ACTOR_RESTARTS) $(if $(EVAL_EVERY),--eval-every $(EVAL_EVERY)) \
		$(if $(PARTICIPATION),--participation $(PARTICIPATION)) $(if $(CLIENT_MEMORY),--client-memory $(CLIENT_MEMORY)) \
		$(if $(SPREAD),--spread) $(if $(filter 0,$(CUDNN_BENCHMARK)),--no-cudnn-benchmark) \
		--gpus-per-actor $(GPUS_PER_ACTOR) --driver-gpus $(DRIVER_GPUS) $(if $(DRY_RUN),--dry-run)

## every figure again from the run folders (table reports, smoke reports, the demo), no training
figures: $(STAMP)
	$(PY) -m ray_jobs.figures all

clean:
	rm -rf $(VENV) .cache
