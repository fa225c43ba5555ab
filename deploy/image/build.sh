#!/usr/bin/env bash
# Builds the gpuwatch agent image with podman + runc without pulling anything, then
# smoke-runs it exactly as the DaemonSet's security context says and checks that it works.
#
#   deploy/image/build.sh                 # build + smoke run (root: it writes /dev/kmsg)
#   deploy/image/build.sh --no-smoke      # build only
#   IMAGE=registry.example/gpuwatch:tag deploy/image/build.sh
#
# The image is FROM scratch: the release `gpuwatch` binary (not the demo binary, which
# writes to the kernel log), the glibc libraries it links, and those libnvidia-ml.so.1
# loads (libc, libm, libdl, libpthread, librt, the loader). Its tag is the crate version.
#
# The smoke run mirrors deploy/kubernetes/base/daemonset.yaml: read-only root filesystem,
# --cap-drop ALL --cap-add SYSLOG, no-new-privileges (allowPrivilegeEscalation: false), the
# DaemonSet's user (0:0), the default seccomp profile (RuntimeDefault), /dev/kmsg as a
# device (what the NRI device injector / CRI-O annotation grants), the state directory as
# a writable volume (the hostPath), the config read-only (the ConfigMap), a small tmpfs on
# /tmp (the emptyDir), and nvml-sim bind-mounted as libnvidia-ml.so.1 where the NVIDIA
# container toolkit would mount the real one. It checks: /healthz and /v1/health answer;
# an XID written to the host's /dev/kmsg is reported from inside the container (stdout
# event and /v1/health); the state file lands on the volume; SIGTERM exits 0. Then it runs
# the two negative checks deploy/README.md relies on: /dev/kmsg bind-mounted without the
# device rule, and a non-root user with CAP_SYSLOG requested.
#
# Environment: CARGO_TARGET_DIR (where cargo builds), IMAGE (default
# localhost/gpuwatch:<crate version>), CONTAINERS_CONF (default: containers.conf beside
# this script; the settings that work on a build machine that is itself a container).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"

smoke=1
case "${1:-}" in
  --no-smoke) smoke=0 ;;
  "") ;;
  *) echo "usage: $0 [--no-smoke]" >&2; exit 2 ;;
esac

step() { printf '\n--> %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
for tool in podman runc cargo curl nsenter jq readelf strip; do
  command -v "$tool" >/dev/null \
    || fail "$tool is required (Debian: apt-get install podman runc curl util-linux jq binutils)"
done

version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
[ -n "$version" ] || fail "no version in [workspace.package] of Cargo.toml"
revision="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
image="${IMAGE:-localhost/gpuwatch:$version}"
target="${CARGO_TARGET_DIR:-$repo/target}"

step "Building the release binary and nvml-sim (the first build takes a few minutes)"
# One invocation for both packages: building them separately resolves different feature
# sets and rebuilds every dependency. Only the agent binary goes into the image (not
# gpuwatch-demo); nvml-sim is for the smoke run.
cargo build --release --locked -p gpuwatch -p nvml-sim
bin="$target/release/gpuwatch"
simlib="$target/release/libnvml_sim.so"
if [ ! -x "$bin" ] || [ ! -f "$simlib" ]; then fail "cargo did not produce $bin and $simlib"; fi

work="$(mktemp -d /tmp/gpuwatch-image.XXXXXX)"
container=""
cleanup() {
  if [ -n "$container" ]; then
    podman rm -f "$container" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

step "Staging the root filesystem"
rootfs="$work/context/rootfs"
install -D -m 0755 "$bin" "$rootfs/usr/local/bin/gpuwatch"
# The release profile keeps line tables for backtraces: three quarters of the binary's size,
# none of it loaded at run time. The image drops them; panics still name the functions.
strip --strip-debug "$rootfs/usr/local/bin/gpuwatch"
# The loader is the binary's ELF interpreter; the libraries go to the multiarch directory
# of the glibc that built the binary, which that loader searches without an ld.so.cache.
loader="$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
[ -n "$loader" ] || fail "no ELF interpreter in $bin"
libdir="/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")"
install -D -m 0755 "$(readlink -f "$loader")" "$rootfs$loader"
# What the binary links, plus what libnvidia-ml.so.1 needs when dlopen()ed (NVIDIA links it
# against libc, libm, libdl, libpthread and librt; on glibc >= 2.34 the last three are
# stubs, but the sonames must still resolve).
mapfile -t linked < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $1 }')
for soname in "${linked[@]}" libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libgcc_s.so.1; do
  src=""
  for dir in "$libdir" "/lib/${libdir#/usr/lib/}"; do
    if [ -e "$dir/$soname" ]; then src="$dir/$soname"; break; fi
  done
  [ -n "$src" ] || fail "library $soname not found in $libdir"
  install -D -m 0644 "$(readlink -f "$src")" "$rootfs$libdir/$soname"
done
# Debian's layout: /lib is /usr/lib (merged /usr).
ln -s usr/lib "$rootfs/lib"
# Mount points: read-only root filesystem, so they must exist in the image.
mkdir -p "$rootfs/etc/gpuwatch" "$rootfs/var/lib/gpuwatch" "$rootfs/tmp" "$rootfs/dev" \
  "$rootfs/proc" "$rootfs/sys"
chmod 1777 "$rootfs/tmp"
cp "$here/Containerfile" "$work/context/Containerfile"

step "Building $image"
podman build --quiet --pull=never --no-cache \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  --tag "$image" "$work/context" >/dev/null
size="$(podman image inspect --format '{{.Size}}' "$image")"
printf 'Image %s: %s bytes (%s MiB; the binary %s MiB).\n' "$image" "$size" \
  "$(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1048576 }')" \
  "$(du -m "$rootfs/usr/local/bin/gpuwatch" | cut -f1)"
shown="$(podman run --rm --network none "$image" --version)"
echo "$shown"
[ "$shown" = "gpuwatch $version (commit $revision)" ] \
  || fail "--version says \"$shown\", expected \"gpuwatch $version (commit $revision)\""
# What the image holds, from the image itself. The demo writes fake NVIDIA lines into a
# kernel log: it must not be there.
probe="$(podman create "$image")"
files="$(podman export "$probe" | tar -t | grep -v '/$' | sort)"
podman rm "$probe" >/dev/null
echo "Files in the image: $(tr "\n" " " <<<"$files")"
if grep -q 'gpuwatch-demo' <<<"$files"; then fail "the demo binary is in the image"; fi
grep -qx 'usr/local/bin/gpuwatch' <<<"$files" || fail "no usr/local/bin/gpuwatch in the image"

[ "$smoke" = 1 ] || exit 0

step "Smoke run with the DaemonSet's security context"
[ "$(id -u)" = 0 ] || fail "the smoke run needs root (it writes a record into /dev/kmsg)"
mkdir -p "$work/state" "$work/config"
cp "$here/smoke.toml" "$work/config/gpuwatch.toml"
# The demo scenario's 8 GPUs, moved to a PCI domain of this run's own. The agent reads the
# whole kernel ring on its first start, as on a node, and the ring keeps what earlier runs
# (and the demo, and other tests) wrote until it wraps: an XID already there for one of
# these GPUs would make this run's XID a repeat of an active fault, not a new event.
domain="$(printf '%04x' $(( 0x1000 + $(od -An -N2 -tu2 /dev/urandom) % 0xe000 )))"
scenario="$work/scenario.toml"
sed "s/^pci = \"00000000:/pci = \"$domain:/" "$repo/nvml-sim/scenarios/demo.toml" >"$scenario"
[ "$(grep -c "^pci = \"$domain:" "$scenario")" = 8 ] \
  || fail "could not move the scenario's GPUs to PCI domain $domain"
# What the DaemonSet gives the container, flag by flag (base/daemonset.yaml).
# shellcheck disable=SC2054 # the commas are inside one --tmpfs option
secure=(
  --read-only --read-only-tmpfs=false       # readOnlyRootFilesystem: true
  --cap-drop ALL --cap-add SYSLOG           # capabilities: drop [ALL], add [SYSLOG]
  --security-opt no-new-privileges          # allowPrivilegeEscalation: false
  --user 0:0                                # runAsUser: 0, runAsGroup: 0
  --network none                            # probes reach it inside its namespace
  --tmpfs /tmp:rw,size=8m,mode=1777         # the tmp emptyDir (medium: Memory, 8Mi)
)
nvml=(
  # Where the NVIDIA container toolkit mounts the host's libnvidia-ml.so.1.
  -v "$simlib:$libdir/libnvidia-ml.so.1:ro"
  -v "$scenario:/etc/nvml-sim/scenario.toml:ro"
  -e GPUWATCH_NVML_SIM_SCENARIO=/etc/nvml-sim/scenario.toml
)
container="gpuwatch-smoke-$$"
podman run -d --name "$container" "${secure[@]}" "${nvml[@]}" \
  --device /dev/kmsg:/dev/kmsg:r \
  -v "$work/state:/var/lib/gpuwatch:rw" \
  -v "$work/config:/etc/gpuwatch:ro" \
  -v /proc:/host/proc:ro \
  "$image" run --config /etc/gpuwatch/gpuwatch.toml >/dev/null
pid="$(podman inspect --format '{{.State.Pid}}' "$container")"
# curl from the host inside the container's network namespace: the image has no shell.
api() { nsenter --target "$pid" --net curl -fsS --max-time 2 "http://127.0.0.1:9400$1"; }
logs() { podman logs "$container" 2>&1 | tail -n 30; }

ok=0
for _ in $(seq 1 100); do
  if api /healthz >/dev/null 2>&1; then ok=1; break; fi
  sleep 0.1
done
[ "$ok" = 1 ] || { logs; fail "/healthz did not answer"; }
echo "/healthz answers."
# NVML through the mounted library: all 8 simulated GPUs, before the XID is written (so the
# event can name the GPU's UUID).
health=""
gpus=0
for _ in $(seq 1 100); do
  health="$(api /v1/health || true)"
  gpus="$(grep -o '"uuid":"GPU-[^"]*"' <<<"$health" | sort -u | wc -l)"
  [ "$gpus" = 8 ] && break
  sleep 0.1
done
[ "$gpus" = 8 ] || { echo "$health"; fail "/v1/health shows $gpus GPUs, the scenario has 8"; }
echo "/v1/health answers: 8 GPUs through the mounted NVML library."

# A marker of our own in the process name, so records other writers put into the kernel log
# (or an earlier run) are not mistaken for ours. Bus 18 of this run's domain is GPU 0.
marker="imgsmoke$$x$RANDOM"
printf '<4>NVRM: Xid (PCI:%s:18:00): 79, pid=4242, name=%s, GPU has fallen off the bus.\n' \
  "$domain" "$marker" >/dev/kmsg
event=""
for _ in $(seq 1 100); do
  event="$(podman logs "$container" 2>/dev/null | grep -F "$marker" | grep -F '"kind"' | head -n 1 || true)"
  [ -n "$event" ] && break
  sleep 0.1
done
[ -n "$event" ] || { logs; fail "the XID written to /dev/kmsg was not reported by the container"; }
echo "Event from the container: $event"
for want in '"code":79' '"source":"kmsg"' '"facility":1' '"gpu_uuid":"GPU-5a1c2f3e-8b4d-4e6f-9a0b-1c2d3e4f5a60"'; do
  grep -qF "$want" <<<"$event" || fail "the event lacks $want"
done

# The fault on GPU 0 itself (not any XID 79 in the answer).
gpu0_xid79() {
  jq -e '.gpus[] | select(.uuid == "GPU-5a1c2f3e-8b4d-4e6f-9a0b-1c2d3e4f5a60")
    | .active_faults[] | select(.reason == "XID79")' <<<"$1" >/dev/null 2>&1
}
health=""
for _ in $(seq 1 50); do
  health="$(api /v1/health || true)"
  gpu0_xid79 "$health" && break
  sleep 0.1
done
gpu0_xid79 "$health" || { echo "$health"; fail "/v1/health does not show the XID 79 on GPU 0"; }
echo "/v1/health shows the XID 79 on GPU 0."

podman stop --time 20 "$container" >/dev/null
code="$(podman inspect --format '{{.State.ExitCode}}' "$container")"
[ "$code" = 0 ] || { logs; fail "SIGTERM exit status $code, expected 0"; }
echo "SIGTERM: exit status 0."
state_files="$(find "$work/state" -type f | wc -l)"
[ "$state_files" -gt 0 ] || fail "nothing was written to the state volume"
echo "State volume: $(cd "$work/state" && find . -type f | sed 's|^\./||' | tr '\n' ' ')"
podman rm "$container" >/dev/null
container=""

step "Negative checks behind deploy/README.md"
# 1. /dev/kmsg bind-mounted like a hostPath volume, without a device-cgroup rule: the open
#    is refused (what an unprivileged pod gets without the NRI device injector / CRI-O
#    annotation), the agent reports the kmsg input down and keeps running.
out="$(timeout 20 podman run --rm "${secure[@]}" \
  -v /dev/kmsg:/dev/kmsg:ro -v "$work/config:/etc/gpuwatch:ro" \
  -v "$work/state:/var/lib/gpuwatch:rw" \
  --entrypoint /usr/local/bin/gpuwatch "$image" \
  validate --config /etc/gpuwatch/gpuwatch.toml --expected-gpus 1 --json 2>&1 || true)"
if grep -qi 'operation not permitted\|permission denied' <<<"$out"; then
  echo "Without a device rule: /dev/kmsg cannot be opened (as deploy/README.md says)."
else
  echo "$out" | tail -n 20
  fail "/dev/kmsg opened without a device-cgroup rule: deploy/README.md is wrong"
fi

# 2. Non-root, as Kubernetes would run it. podman puts --cap-add capabilities into the
#    ambient set for a non-root user, so it cannot show this; containerd's and CRI-O's CRI
#    code clear the ambient (and inheritable) set, so a non-root process loses CAP_SYSLOG at
#    execve(). runc runs the image's root filesystem here with the capability sets the CRI
#    gives a container with `capabilities: {drop: [ALL], add: [SYSLOG]}`: bounding,
#    permitted and effective = {CAP_SYSLOG}, ambient and inheritable empty, no_new_privs,
#    read-only root, /dev/kmsg allowed by the device cgroup. UID 0 and UID 65532 are compared.
kmsg_as() {
  local uid="$1" bundle="$work/runc-$1"
  mkdir -p "$bundle"
  (cd "$bundle" && runc spec)
  jq --arg rootfs "$rootfs" --argjson uid "$uid" '
    .root = {path: $rootfs, readonly: true}
    | .process.terminal = false
    | .process.user = {uid: $uid, gid: $uid}
    | .process.args = ["/usr/local/bin/gpuwatch", "validate", "--expected-gpus", "1"]
    | .process.noNewPrivileges = true
    | .process.capabilities = {bounding: ["CAP_SYSLOG"], permitted: ["CAP_SYSLOG"],
        effective: ["CAP_SYSLOG"], inheritable: [], ambient: []}
    | .linux.devices = [{path: "/dev/kmsg", type: "c", major: 1, minor: 11,
        fileMode: 420, uid: 0, gid: 0}]
    | .linux.resources.devices = [{allow: false, access: "rwm"},
        {allow: true, type: "c", major: 1, minor: 11, access: "r"}]
  ' "$bundle/config.json" >"$bundle/config.new" && mv "$bundle/config.new" "$bundle/config.json"
  timeout 20 runc --root "$work/runc-state" run --bundle "$bundle" "gpuwatch-nonroot-$$-$uid" 2>&1 \
    | grep -E '^ +(ok|FAIL) +kmsg:' || true
}
as_root="$(kmsg_as 0)"
as_user="$(kmsg_as 65532)"
restrict="$(cat /proc/sys/kernel/dmesg_restrict)"
echo "Kernel log check, CRI capability sets, kernel.dmesg_restrict=$restrict:"
echo "  UID 0:     ${as_root## }"
echo "  UID 65532: ${as_user## }"
grep -q '^ *ok' <<<"$as_root" || fail "UID 0 with CAP_SYSLOG could not read /dev/kmsg"
if [ "$restrict" = 1 ]; then
  grep -qi 'not permitted' <<<"$as_user" \
    || fail "a non-root UID read /dev/kmsg with dmesg_restrict=1: deploy/README.md is wrong"
  echo "Non-root cannot read /dev/kmsg under Kubernetes' capability rules (deploy/README.md)."
else
  grep -q '^ *ok' <<<"$as_user" || fail "a non-root UID could not read /dev/kmsg with dmesg_restrict=0"
  echo "dmesg_restrict=0 here: a non-root UID reads /dev/kmsg without any capability."
fi

step "Image $image built and smoke-tested."
