#!/usr/bin/env bash
# Real data for the deduplication benchmark: three sets that a SAN would hold, built once and
# kept in DATA, so that Tessera, restic and borg are compared on the same bytes.
#
# os      A VM image library: Debian bookworm root file systems of different package sets
#         (mmdebstrap from the mirror apt uses here, with its updates and security suites;
#         variant minbase plus each set's packages), each a raw ext4 image made with
#         mkfs.ext4 -d, never mounted. All images have one size, the largest tree plus HEADROOM
#         percent rounded up to 64 MiB, as a library cloned from one template disk size would:
#         the smaller systems have more free space, like real ones. The images are sparse.
# pgdump  The seed's experiment: a throw-away PostgreSQL 15 cluster, a table of 5 random fields
#         with BASE_ROWS rows to start, then ROUNDS times: insert ROWS random rows, pg_dump
#         (plain SQL) to dump-N.sql. Each dump holds the previous one's rows plus the new ones
#         (and, as pg_dump writes since 15.14, a random \restrict key in its first lines).
# files   A file server: documentation and source-like trees that Debian installs (docs, man
#         pages, headers, Perl and Python libraries, translations), FILES_MIB at most, as one
#         raw ext4 image. Its content is whatever this machine has installed.
#
# A set is rebuilt when it is missing, half-built or built with other settings; otherwise it is
# reused. Progress goes to stderr; stdout gets one line per file of the sets: SET PATH BYTES.
# A build from scratch takes about 10 minutes on 2 cores (os 8, mostly downloads; files 1-4,
# see mkimage) and needs about 5 GB free while it runs; the sets keep 5.2 GB, 2.8 GB allocated.
#
# Usage: bench/dedup-data.sh   (DATA=/var/tmp/tessera-dedup-data SETS="os pgdump files"
#          OS_IMAGES="base: postgres:postgresql ..." HEADROOM=30 ROUNDS=5 ROWS=1000 BASE_ROWS=0
#          FILES_MIB=1024)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-/var/tmp/tessera-dedup-data}
SETS=${SETS:-"os pgdump files"}
# NAME:PACKAGES (comma-separated, on top of minbase): servers a VM library plausibly holds.
OS_IMAGES=${OS_IMAGES:-"base: postgres:postgresql nginx:nginx build:build-essential,git
  python-ssh:python3,openssh-server apache-php:apache2,libapache2-mod-php"}
HEADROOM=${HEADROOM:-30}
ROUNDS=${ROUNDS:-5}
ROWS=${ROWS:-1000}
BASE_ROWS=${BASE_ROWS:-0}
FILES_MIB=${FILES_MIB:-1024}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
DIR=$DATA    # for lib.sh's logged: logs go to $DATA/logs
source bench/lib.sh
require mmdebstrap mkfs.ext4 runuser flock "$PGBIN/initdb" "$PGBIN/pg_ctl" "$PGBIN/pg_dump"

mkdir -p "$DATA/logs"
exec 9> "$DATA/.lock"
flock -n 9 || { echo "another bench/dedup-data.sh is building in $DATA" >&2; exit 1; }
WORK=$DATA/.work    # intermediates (tars, trees, the database cluster), gone at exit
PG=$WORK/pg
cleanup() {
  if [ -f "$PG/data/postmaster.pid" ]; then
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG/data" -m immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap "exit 143" INT TERM    # so that the EXIT trap runs on these too
cleanup; mkdir -p "$WORK"    # first what a killed run may have left

say() { echo "$(date +%T) $*" >&2; }

# Allocated bytes of a tree: what its files take in 4 KiB blocks, as in the image.
tree_bytes() { du -s -B1 "$1" | cut -f1; }

# Image size in MiB for a tree of the given bytes: plus HEADROOM percent, whole 64 MiB.
image_mib() { echo $(( ($1 * (100 + HEADROOM) / 100 + (64 << 20) - 1) / (64 << 20) * 64 )); }

# mkimage TREE IMG MIB: a raw ext4 image holding TREE, made without mounting anything. Root
# owns the image's root directory whoever runs it; inodes are raised above mke2fs's one per
# 16 KiB when the tree has more small files than that allows. mke2fs -d scans a directory's
# blocks for every entry it adds, so directories of thousands of files (man3) take minutes.
mkimage() {
  local files inodes
  files=$(find "$1" | wc -l)
  inodes=$(( ($3 << 20) / 16384 ))
  (( files * 5 / 4 <= inodes )) || inodes=$(( files * 5 / 4 ))
  logged mkfs.log mkfs.ext4 -F -d "$1" -E root_owner=0:0 -N "$inodes" "$2" "${3}M"
}

# build SET STAMP: runs build_SET in a fresh $DATA/SET unless a finished one has this stamp.
build() {
  local set=$1 stamp=$2 t0=$SECONDS
  if [ "$(cat "$DATA/$set/.built" 2>/dev/null)" = "$stamp" ]; then
    say "$set: reusing $DATA/$set"
    return
  fi
  rm -rf "${DATA:?}/$set"; mkdir -p "$DATA/$set"
  "build_$set"
  echo "$stamp" > "$DATA/$set/.built"    # last: a set without it is half-built
  say "$set: built in $((SECONDS - t0)) s"
}

# The Debian mirror (and security mirror) apt uses here, from deb822 or one-line sources.
apt_uris() {
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | cut -d: -f2-
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | sed 's/\[[^]]*\]//' \
      | awk '{print $2}'; } | tr ' ' '\n' | grep .
}

build_os() {
  local mirror security spec name pkgs trees=() max=0 b mib
  mirror=$(apt_uris | grep -E '/debian/?$' | head -1) || true
  security=$(apt_uris | grep -E '/debian-security/?$' | head -1) || true
  [ -n "$mirror" ] || { echo "no Debian mirror in the apt sources" >&2; exit 1; }
  local sources=("deb $mirror bookworm main" "deb $mirror bookworm-updates main")
  [ -z "$security" ] || sources+=("deb $security bookworm-security main")
  : > "$DATA/logs/mmdebstrap.log"
  for spec in $OS_IMAGES; do
    name=${spec%%:*}; pkgs=${spec#*:}
    say "os: $name (minbase${pkgs:+ + ${pkgs//,/ }})"
    # Root mode: mmdebstrap itself mounts /proc, /sys and /dev into its temporary chroot for the
    # packages' scripts; the tarball output needs no mount of ours.
    TMPDIR=$WORK logged mmdebstrap.log mmdebstrap --variant=minbase ${pkgs:+--include="$pkgs"} \
      bookworm "$WORK/$name.tar" "${sources[@]}"
    mkdir "$WORK/$name"
    tar -C "$WORK/$name" --numeric-owner --xattrs --xattrs-include='*' -xpf "$WORK/$name.tar"
    rm "$WORK/$name.tar"
    trees+=("$name")
    b=$(tree_bytes "$WORK/$name"); (( b <= max )) || max=$b
  done
  mib=$(image_mib "$max")
  say "os: largest tree $((max >> 20)) MiB, images of $mib MiB"
  for name in "${trees[@]}"; do
    mkimage "$WORK/$name" "$DATA/os/$name.img" "$mib"
    rm -rf "${WORK:?}/$name"
  done
}

build_pgdump() {
  local port=5432 n
  # TCP is off and the socket is in a directory of its own: no clash with any other server,
  # whatever the port number.
  mkdir -p "$PG/data" "$PG/sock"
  : > "$DATA/logs/postgres-server.log"
  chown postgres: "$PG/data" "$PG/sock" "$DATA/logs/postgres-server.log"
  pg() { runuser -u postgres -- "$@"; }
  logged postgres.log pg "$PGBIN/initdb" -D "$PG/data" -E UTF8 --locale=C --auth=trust --no-sync
  logged postgres.log pg "$PGBIN/pg_ctl" -D "$PG/data" -l "$DATA/logs/postgres-server.log" -w start \
    -o "-c listen_addresses='' -k $PG/sock -p $port -c fsync=off"
  sql() { pg "$PGBIN/psql" -h "$PG/sock" -p "$port" -X -q -v ON_ERROR_STOP=1 "$@"; }
  sql -d postgres -c 'CREATE DATABASE testdb'
  sql -d testdb -c 'CREATE TABLE t (name text, code text, amount bigint, ratio double precision, note text)'
  insert() {
    sql -d testdb -c "INSERT INTO t SELECT md5(random()::text), substr(md5(random()::text), 1, 8),
      (random() * 1e12)::bigint, random(),
      substr(md5(random()::text) || md5(random()::text), 1, 8 + (random() * 56)::int)
      FROM generate_series(1, $1)"
  }
  (( BASE_ROWS == 0 )) || insert "$BASE_ROWS"
  for n in $(seq "$ROUNDS"); do
    insert "$ROWS"
    pg "$PGBIN/pg_dump" -h "$PG/sock" -p "$port" -d testdb > "$DATA/pgdump/dump-$n.sql"
    say "pgdump: dump-$n.sql $(stat -c %s "$DATA/pgdump/dump-$n.sql") bytes, $((BASE_ROWS + n * ROWS)) rows"
  done
  logged postgres.log pg "$PGBIN/pg_ctl" -D "$PG/data" -m fast -w stop
}

build_files() {
  local d b total=0 cap=$((FILES_MIB << 20))
  mkdir -m 755 "$WORK/files"
  shopt -s nullglob
  # Whole trees in this order while they fit under the cap (a tree that does not is skipped).
  for d in /usr/share/doc /usr/share/man /usr/share/info /usr/include /usr/src /usr/share/perl \
           /usr/share/perl5 /usr/lib/python3 /usr/lib/python3.[0-9]* /usr/share/locale \
           /usr/share/i18n /usr/share/vim /usr/share/cmake-* /usr/share/javascript \
           /usr/share/tcltk /usr/share/postgresql /usr/share/icons; do
    [ -d "$d" ] || continue
    b=$(tree_bytes "$d")
    (( total + b <= cap )) || { say "files: skipping $d ($((b >> 20)) MiB): over $FILES_MIB MiB"; continue; }
    mkdir -p "$WORK/files${d%/*}"
    cp -a "$d" "$WORK/files$d"    # not --parents: it fails with -a in coreutils 9.1
    total=$((total + b))
  done
  shopt -u nullglob
  say "files: $((total >> 20)) MiB in $(find "$WORK/files" -type f | wc -l) files"
  mkimage "$WORK/files" "$DATA/files/files.img" "$(image_mib "$total")"
  rm -rf "${WORK:?}/files"
}

say "data sets in $DATA; df -h: $(df -h --output=avail "$DATA" | tail -1 | tr -d ' ') free"
for set in $SETS; do
  case $set in
    os)     build os "$(echo OS_IMAGES=$OS_IMAGES HEADROOM=$HEADROOM)" ;;
    pgdump) build pgdump "ROUNDS=$ROUNDS ROWS=$ROWS BASE_ROWS=$BASE_ROWS" ;;
    files)  build files "FILES_MIB=$FILES_MIB HEADROOM=$HEADROOM" ;;
    *) echo "unknown set $set (os, pgdump, files)" >&2; exit 1 ;;
  esac
done

for set in $SETS; do
  case $set in
    os)     ls "$DATA"/os/*.img ;;
    pgdump) ls -v "$DATA"/pgdump/dump-*.sql ;;
    files)  echo "$DATA/files/files.img" ;;
  esac | while read -r f; do echo "$set $f $(stat -c %s "$f")"; done
done
