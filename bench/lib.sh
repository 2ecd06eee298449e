# Helpers the benchmarks share (sourced, not run): the tessera binary and the engine's bench
# programs, the daemon on a scratch state directory, required commands, logged setup commands,
# medians, package versions.
# The sourcing script sets DIR (scratch directory, with logs/ in it) and KEEP.

# Sets T to the tessera binary: TESSERA_BIN, or a cargo build of PROFILE (default release).
tessera_binary() {
  if [ -n "${TESSERA_BIN:-}" ]; then
    T=$TESSERA_BIN
  else
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}
    PROFILE=${PROFILE:-release}
    cargo build --profile "$PROFILE" -q -p tessera-cli
    T=$CARGO_TARGET_DIR/$(profile_dir)/tessera
  fi
}

# Sets BIN to an example program of the volume crate (enginebench, scanbench), built with
# PROFILE (default release; PROFILE=test reuses the test suite's build, dependencies at
# opt-level 2, instead of compiling RocksDB once more for release).
volume_example() {
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}
  PROFILE=${PROFILE:-release}
  cargo build --profile "$PROFILE" -q -p tessera-volume --example "$1"
  BIN=$CARGO_TARGET_DIR/$(profile_dir)/examples/$1
}

# The directory under CARGO_TARGET_DIR that a build of PROFILE goes to.
profile_dir() {
  case $PROFILE in release) echo release;; test|dev) echo debug;; *) echo "$PROFILE";; esac
}

# Fails when something already listens on one of the given local ports.
ports_free() {
  local p
  for p in "$@"; do
    ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "port $p is in use: set the *_PORT variables" >&2; exit 1; }
  done
}

# Starts `tessera serve` on $DIR/state with the given extra flags, waits until it answers, and
# points the CLI at it. Its pid goes to $DIR/tessera.pid.
start_tessera() {
  "$T" serve --state-dir "$DIR/state" --api-listen none "$@" \
    > "$DIR/logs/tessera.out" 2> "$DIR/logs/tessera.log" &
  echo $! > "$DIR/tessera.pid"
  export TESSERA_API=unix:$DIR/state/api.sock
  for _ in $(seq 100); do "$T" pool list >/dev/null 2>&1 && break; sleep 0.1; done
  "$T" pool list >/dev/null || { echo "tessera serve did not start: $DIR/logs/tessera.log" >&2; KEEP=1; exit 1; }
}

# logged LOG command... : appends the command's output to $DIR/logs/LOG; shows it if it fails.
logged() {
  local log=$DIR/logs/$1; shift
  "$@" >> "$log" 2>&1 || { echo "failed: $*" >&2; cat "$log" >&2; exit 1; }
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# per_run_ratios LABEL "A1 A2 ..." "B1 B2 ...": prints "- LABEL: A1/B1, A2/B2, ...".
per_run_ratios() {
  python3 -c 'import sys; a, b = sys.argv[2].split(), sys.argv[3].split()
print("- %s: %s" % (sys.argv[1], ", ".join("%.2f" % (float(x) / float(y)) for x, y in zip(a, b))))' "$@"
}

pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo '?'; }

# Fails unless the file system that will hold DIR (the nearest existing directory above it is
# asked) has NEED GiB free: a benchmark that fills the disk fails half way, and takes the
# machine's other work down with it.
require_space() {
  local dir=$1 need=$2 at=$1 have
  while [ ! -d "$at" ]; do at=$(dirname "$at"); done
  have=$(( $(df --output=avail -B1 "$at" | tail -1) >> 30 ))
  if [ "$have" -lt "$need" ]; then
    echo "this benchmark needs about $need GiB free under $dir; that file system has $have GiB (free some, or set DIR elsewhere)" >&2
    exit 1
  fi
}

# Fails unless every named command is installed.
require() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null || { echo "$c is missing: scripts/install-deps.sh bench" >&2; exit 1; }
  done
}
