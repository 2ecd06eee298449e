# Tessera. `make demo` starts the embedded demo, `make test` runs the whole test suite; both
# install what a fresh Debian machine lacks first.

# Build products live outside the clone so that repeated runs and CI reuse them.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/tessera/target
CARGO ?= cargo
# Cases per model-based property test; raise it for a longer hunt (TESSERA_PROPTEST_CASES=2000).
export TESSERA_PROPTEST_CASES ?= 24
# Rounds of the SIGKILL crash test, and power cuts of the volatile-cache test.
export TESSERA_CRASH_ROUNDS ?= 50
export TESSERA_POWER_CUT_ROUNDS ?= 24

.PHONY: all build test demo deps test-deps bench fuzz soak clean

all: build

deps:
	@scripts/install-deps.sh build

test-deps:
	@scripts/install-deps.sh test

build: deps
	$(CARGO) build --release --workspace

# Seconds per fuzz target in `make test` (scripts/fuzz.sh); 0 skips fuzzing.
export FUZZ_SECONDS ?= 20

# The scale-out crates' features: their tests run against the Ceph cluster and etcd that
# scripts/test-scale-out.sh starts around the whole run. Off in the default build, which
# then needs neither librados nor protoc.
TEST_FEATURES ?= --features tessera-rados/librados,tessera-ownership/fencing,tessera-cli/rados

test: test-deps
	$(CARGO) build --workspace --tests --profile test $(TEST_FEATURES)
	{ if [ "$(FUZZ_SECONDS)" != 0 ]; then scripts/fuzz.sh; fi; \
	  scripts/test-scale-out.sh $(CARGO) test --workspace --profile test --no-fail-fast $(TEST_FEATURES); \
	  } 2>&1 | scripts/summarize-tests.sh

# The embedded demo: 4 sparse file disks, pool "demo", vdisk "demo/vol1", in ./tessera-demo.
# DEMO_ARGS passes more flags, e.g. DEMO_ARGS="--api-listen 127.0.0.1:9484".
demo: deps
	$(CARGO) build --release -p tessera-cli
	$(CARGO_TARGET_DIR)/release/tessera serve --demo $(DEMO_ARGS)

bench:
	@scripts/install-deps.sh bench
	bench/engine.sh
	bench/image.sh
	bench/iscsi-vs-tgt.sh
	bench/nbd-vs-qemu-nbd.sh
	bench/odx.sh
	bench/dedup.sh
	bench/rados.sh

# Every fuzz target for FUZZ_SECONDS each (300 here), those that drive the engine included:
# their RocksDB build alone takes many minutes, so `make test` leaves them out.
fuzz: test-deps
	FUZZ_SECONDS=$${FUZZ_SECONDS_DEEP:-300} scripts/fuzz.sh iscsi_pdu nbd_proto login_text scsi_cdb disk_label scsi_params replication_wire

# Thousands of power cuts and crashes, for a long hunt (an hour or more here).
soak: test-deps
	TESSERA_POWER_CUT_ROUNDS=$${SOAK_ROUNDS:-2000} TESSERA_CRASH_ROUNDS=$${SOAK_ROUNDS:-2000} \
	  $(CARGO) test --workspace --profile test --test power_cut --test power_cut_lost --test crash -- --nocapture

clean:
	$(CARGO) clean
