#!/usr/bin/env bash
# The fleet storm bench (bench/fleet_storm.py) at 500 and 2,000 nodes on a bigger machine that
# has Python 3.12 and nothing else: no Slurm, no internet, no apt, no systemd. Runs as root.
#
# It needs the folder .fleetpkg/ next to bench/ (or FLEET_PKG=DIR), made on a Debian 12 box:
#   .fleetpkg/debs/    `apt-get download` of slurmctld, slurmd, slurm-client,
#                      slurm-wlm-basic-plugins and every library they link (libc6 included)
#   .fleetpkg/wheels/  `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`
#                      of gpuwatchd's dependencies and pytest (tests/slurm_support.py imports it)
#
# What it does, all under one private temp directory (never onto /):
#   1. unpacks the .debs with `dpkg -x` (or bench/fleet_debx.py where there is no dpkg);
#      glibc into its own prefix, the rest into another;
#   2. puts wrappers for slurmctld, slurmd, sinfo, scontrol, sdiag, ... first on PATH: each sets
#      LD_LIBRARY_PATH to the prefix for its own binary only. When the host's glibc is older
#      than Debian 12's (the binaries fail to start) the wrappers run the binaries under the
#      carried glibc's loader instead (FLEET_LOADER=host|carried forces one);
#   3. installs the wheels with `pip install --no-index --target` (or unzips them where the
#      Python has no pip) and runs Python isolated (-I -S): only the standard library, the
#      wheels and this repo;
#   4. runs bench/fleet_storm.py at each size (a real slurmctld with auth/none on loopback,
#      SlurmUser=root, PluginDir in the prefix; one in-process drain stage per node): peak
#      drained sampled every 100 ms from the controller, settle time (decided_s), slurmctld's
#      request rate and mean time (sdiag), Slurm call failures;
#   5. writes fleet_storm_N.json (with where each stage stopped), fleet_storm_N_trace.jsonl.gz
#      (each stage's protocol steps with their times), the log and the machine's facts
#      under $OUT when set (else
#      under ./fleet-storm-out), and stops everything it started (its own process group).
#
#   bench/fleet_storm_remote.sh                  # 500 then 2,000 nodes, budget 5 %
#   FLEET_SIZES="200" bench/fleet_storm_remote.sh
#
# Knobs (environment): FLEET_SIZES ("500 2000"), FLEET_PERCENT (5), FLEET_PKG, PYTHON (python3),
# FLEET_LOADER (auto), FLEET_STORM_TIMEOUT (seconds of storm per size: "100 240" for the sizes
# in order; the last value repeats), FLEET_CENSUS_SIZES (empty: also run
# bench/fleet_census_cost.py at these sizes, at most 2 minutes). The whole run stays under 9
# minutes at the defaults. The work dir is under $TMPDIR (else /tmp), or under .fleetwork/ in
# this repo where /tmp does not let files be executed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PKG=${FLEET_PKG:-$ROOT/.fleetpkg}
SIZES=${FLEET_SIZES:-"500 2000"}
PERCENT=${FLEET_PERCENT:-5}
PY=${PYTHON:-python3}
LOADER=${FLEET_LOADER:-auto}
TIMEOUTS=${FLEET_STORM_TIMEOUT:-"100 240"}
RESULTS=${OUT:-$PWD/fleet-storm-out}
runs_here() { # DIR: can a file under it be executed (a noexec /tmp cannot)?
    local f rc
    f=$(mktemp "$1/gpuwatchd-exec.XXXXXX") || return 1
    printf '#!/bin/sh\nexit 0\n' > "$f" && chmod +x "$f" && "$f"
    rc=$?
    rm -f "$f"
    return $rc
}
BASE=${TMPDIR:-/tmp}
runs_here "$BASE" 2>/dev/null || { BASE=$ROOT/.fleetwork && mkdir -p "$BASE"; }
WORK=$(mktemp -d "$BASE/gpuwatchd-fleet-remote.XXXXXX")
BENCH_PID=""
SETSID=()

say() { printf '[fleet_storm_remote %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

stop_bench() {
    # SIGINT first: the bench's finally stops slurmctld/slurmd and keeps their logs
    [ -n "$BENCH_PID" ] || return 0
    if kill -0 "$BENCH_PID" 2>/dev/null; then
        kill -INT "$BENCH_PID" 2>/dev/null || true
        for _ in $(seq 1 30); do
            kill -0 "$BENCH_PID" 2>/dev/null || break
            sleep 1
        done
    fi
    # then anything left in its process group (the bench runs under setsid)
    [ ${#SETSID[@]} -eq 0 ] || kill -KILL -- "-$BENCH_PID" 2>/dev/null || true
    kill -KILL "$BENCH_PID" 2>/dev/null || true
    wait "$BENCH_PID" 2>/dev/null || true
    BENCH_PID=""
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_bench
    # a slurm daemon that outlived its bench (pid files under the private work dir)
    while IFS= read -r f; do
        pid=$(cat "$f" 2>/dev/null || true)
        [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
    done < <(find "$WORK" -name 'slurm*.pid' 2>/dev/null)
    rm -rf "$WORK"
    [ "$BASE" != "$ROOT/.fleetwork" ] || rmdir "$BASE" 2>/dev/null || true
    say "done (status $rc); results in $RESULTS"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$RESULTS" "$WORK/tmp" "$WORK/bin"
export TMPDIR="$WORK/tmp" # every temp dir (the bench's Slurm, conftest's) under the work dir
exec > >(tee -a "$RESULTS/fleet_storm_remote.log") 2>&1

[ -d "$PKG/debs" ] && [ -d "$PKG/wheels" ] || {
    say "no $PKG/debs or $PKG/wheels: carry the .fleetpkg folder (see the head of this script)"
    exit 2
}
if command -v sha256sum >/dev/null 2>&1; then
    (cd "$PKG" && sha256sum --quiet -c "$ROOT/bench/fleet_storm_remote.sha256") || {
        say "$PKG does not match bench/fleet_storm_remote.sha256 (a file missing or changed)"
        exit 2
    }
fi
say "machine: $(uname -srm), $(nproc) CPUs, $("$PY" -c 'import sys; print(sys.version.split()[0])'), $(id -un)"
{
    uname -a
    nproc
    "$PY" -VV
    grep -m1 'model name' /proc/cpuinfo || true
    free -m 2>/dev/null || true
    cat /etc/os-release 2>/dev/null || true
} > "$RESULTS/fleet_storm_remote_machine.txt" 2>&1

# 2,000 stages each hold pipes to their sinfo/scontrol processes; slurmctld holds the sockets
ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 65536 2>/dev/null || true
ulimit -u unlimited 2>/dev/null || true
say "open files limit $(ulimit -n)"

# 1. unpack
PREFIX=$WORK/prefix
GLIBC=$WORK/glibc
mkdir -p "$PREFIX" "$GLIBC"
unpack() { # TARGET DEB...
    local target=$1
    shift
    if command -v dpkg >/dev/null 2>&1; then
        for deb in "$@"; do dpkg -x "$deb" "$target"; done
    else
        "$PY" -I "$ROOT/bench/fleet_debx.py" "$target" "$@"
    fi
}
shopt -s nullglob
libc_debs=("$PKG"/debs/libc6_*.deb)
other_debs=()
for deb in "$PKG"/debs/*.deb; do
    case $(basename "$deb") in libc6_*) ;; *) other_debs+=("$deb") ;; esac
done
[ ${#libc_debs[@]} -eq 1 ] && [ ${#other_debs[@]} -gt 0 ] || {
    say "want one libc6 .deb and the Slurm .debs in $PKG/debs"
    exit 2
}
unpack "$GLIBC" "${libc_debs[@]}"
unpack "$PREFIX" "${other_debs[@]}"
say "unpacked ${#other_debs[@]} packages (+ libc6) into $WORK ($(du -sh "$WORK" | cut -f1))"

ARCH=x86_64-linux-gnu
PLUGINS=$PREFIX/usr/lib/$ARCH/slurm-wlm
LIBS=$PLUGINS:$PREFIX/usr/lib/$ARCH:$PREFIX/lib/$ARCH
LDSO=$GLIBC/lib/$ARCH/ld-linux-x86-64.so.2
[ -f "$PLUGINS/libslurmfull.so" ] || {
    say "no libslurmfull.so under $PLUGINS"
    exit 2
}

# 2. wrappers
binary() { # NAME -> its path in the prefix (Debian names the daemons NAME-wlm)
    local d
    for d in usr/sbin usr/bin; do
        for n in "$1" "$1-wlm"; do
            [ -x "$PREFIX/$d/$n" ] && { echo "$PREFIX/$d/$n"; return 0; }
        done
    done
    return 1
}
write_wrappers() { # host|carried
    local name bin
    for name in slurmctld slurmd slurmstepd sinfo scontrol sdiag squeue sbatch scancel srun; do
        bin=$(binary "$name") || continue
        # slurmd looks for slurmstepd where Debian installs it (/usr/sbin) and exits where
        # that is missing: point it at the prefix's (-d; the storm runs no job steps)
        args='"$@"'
        [ "$name" = slurmd ] && args="-d \"$WORK/bin/slurmstepd\" $args"
        if [ "$1" = carried ]; then
            printf '#!/bin/sh\nexec "%s" --library-path "%s" --argv0 "%s" "%s" %s\n' \
                "$LDSO" "$GLIBC/lib/$ARCH:$LIBS" "$name" "$bin" "$args" > "$WORK/bin/$name"
        else
            printf '#!/bin/sh\nexport LD_LIBRARY_PATH="%s"\nexec "%s" %s\n' \
                "$LIBS" "$bin" "$args" > "$WORK/bin/$name"
        fi
        chmod +x "$WORK/bin/$name"
    done
}
# the client tools read a slurm.conf before anything, --version included: a minimal one
mkdir -p "$WORK/probe"
printf 'ClusterName=probe\nSlurmctldHost=localhost\nAuthType=auth/none\nPluginDir=%s\n' \
    "$PLUGINS" > "$WORK/probe/slurm.conf"
probe() { SLURM_CONF=$WORK/probe/slurm.conf "$WORK/bin/$1" "${@:2}"; }
works() { probe sinfo --version >/dev/null 2>&1 && probe slurmctld -V >/dev/null 2>&1; }
case $LOADER in
    auto)
        write_wrappers host
        if works; then LOADER=host; else
            say "the host's loader cannot run the Debian 12 binaries ($(probe sinfo --version 2>&1 | head -1)): using the carried glibc"
            write_wrappers carried
            LOADER=carried
        fi
        ;;
    host | carried) write_wrappers "$LOADER" ;;
    *) say "FLEET_LOADER is auto, host or carried, not $LOADER"; exit 2 ;;
esac
works || {
    say "Slurm does not start from the prefix:"
    probe sinfo --version || true
    probe slurmctld -V || true
    exit 3
}
say "$(probe sinfo --version) from the prefix, loader: $LOADER"

# 3. Python packages
SITE=$WORK/site
# the wheels for this Python: pure and abi3 ones, and the compiled ones of its version
pytag=$("$PY" -I -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
wheels=()
for w in "$PKG"/wheels/*.whl; do
    case $(basename "$w") in
        *-cp3[0-9]*-cp3[0-9]*-*) [[ $(basename "$w") == *-$pytag-$pytag-* ]] && wheels+=("$w") ;;
        *) wheels+=("$w") ;;
    esac
done
if "$PY" -I -m pip --version >/dev/null 2>&1; then
    PIP_CONFIG_FILE=/dev/null PIP_ROOT_USER_ACTION=ignore "$PY" -I -m pip install --quiet \
        --no-index --no-deps --disable-pip-version-check --no-warn-script-location \
        --target "$SITE" "${wheels[@]}"
else
    say "no pip in $PY: unzipping the wheels"
    "$PY" -I -c 'import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])' "$SITE" "${wheels[@]}"
fi
# Python runs isolated (-I -S): it sees only the standard library, $SITE and this repo
BOOT='import runpy, sys
sys.path[:0] = [sys.argv[1]]
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")'
"$PY" -I -S -c 'import sys
sys.path[:0] = sys.argv[1:]
import yaml, pytest, slurm_support  # the bench imports these
import gpuwatchd.actions.fleet, gpuwatchd.actions.drain.drivers.slurm, gpuwatchd.config.actions
print("imports ok:", gpuwatchd.__file__, yaml.__file__)' "$SITE" "$ROOT" "$ROOT/tests"
SETSID=()
command -v setsid >/dev/null 2>&1 && SETSID=(setsid)

# 4. the storm at each size
export PATH="$WORK/bin:$PATH"
unset SLURM_CONF
read -r -a timeouts <<< "$TIMEOUTS"
status=0
run_bench() { # WHAT LIMIT_S SCRIPT ARGS...: one bench, stopped after LIMIT_S seconds
    local what=$1 limit=$2
    shift 2
    local started=$SECONDS
    "${SETSID[@]}" "$PY" -I -S -c "$BOOT" "$SITE" "$@" &
    BENCH_PID=$!
    while kill -0 "$BENCH_PID" 2>/dev/null; do
        if [ $((SECONDS - started)) -gt "$limit" ]; then
            say "$what ran past $limit s: stopping it"
            stop_bench
            status=4
            break
        fi
        sleep 1
    done
    if [ -n "$BENCH_PID" ]; then
        wait "$BENCH_PID" || { say "$what failed (status $?)"; status=4; }
        BENCH_PID=""
    fi
    say "$what took $((SECONDS - started)) s"
    left=$(pgrep -a -f "$WORK" | grep -v -e pgrep -e fleet_storm_remote || true)
    [ -z "$left" ] || say "left running after $what: $left"
}
i=0
for n in $SIZES; do
    t=${timeouts[$i]:-${timeouts[-1]}}
    i=$((i + 1))
    say "storm: $n nodes, budget $PERCENT %, at most $t s of storm"
    # slurm start-up, the wait for the node registrations (at most 30 s) and the report get
    # 75 s on top of the storm
    run_bench "storm at $n nodes" $((${t%.*} + 75)) "$ROOT/bench/fleet_storm.py" \
        -n "$n" --percent "$PERCENT" --timeout "$t" --plugin-dir "$PLUGINS" \
        --json "$RESULTS/fleet_storm_$n.json" --log-dir "$RESULTS/logs" \
        --trace "$RESULTS/fleet_storm_${n}_trace.jsonl.gz"
done
# optional: what one census costs slurmctld at these sizes (FLEET_CENSUS_SIZES="2000 10000")
census=()
for n in ${FLEET_CENSUS_SIZES:-}; do census+=(-n "$n"); done
if [ ${#census[@]} -gt 0 ]; then
    say "census cost at ${FLEET_CENSUS_SIZES}"
    run_bench "census cost" 120 "$ROOT/bench/fleet_census_cost.py" "${census[@]}" \
        --rounds 10 --plugin-dir "$PLUGINS" --json "$RESULTS/fleet_census_cost.json"
fi
exit $status
