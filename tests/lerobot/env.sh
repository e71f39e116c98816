#!/usr/bin/env bash
# A Python 3.13 environment with real LeRobot 0.6.1, for the tests and benchmarks that compare with it.
#
# LeRobot >= 0.5 needs Python >= 3.12 and this project's machines run Debian 12 (Python 3.11), so the
# environment is a Debian 13 root (debootstrap, Python 3.13, FFmpeg 7.1) holding a venv with
# lerobot[training,diffusion]==0.6.1 and what the tests need beside it (versions pinned in
# tests/lerobot/constraints.txt). Built once per machine (~10 min, ~7 GB), reused after that.
#
#   env.sh setup                 build it (idempotent; rebuilds the venv when the pins change)
#   env.sh run DIR... -- ARGS    run `python ARGS` inside, each DIR (and /tmp) at the same absolute path,
#                                in the caller's directory when it lies in one; the caller's environment passes
#   env.sh root                  print where it lives
#
# The root lives at $LEROBOT_SHARDS_LEROBOT_ROOT (default /var/cache/lerobot-shards/lerobot-0.6.1), outside
# any checkout, so every clone on the machine shares one. `run` mounts in a private mount namespace
# (unshare -m): the bind mounts vanish with the process, even after kill -9. Needs root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=${LEROBOT_SHARDS_LEROBOT_ROOT:-/var/cache/lerobot-shards/lerobot-0.6.1}
py=/opt/lerobot/bin/python
pins="$here/constraints.txt"
stamp="$root/opt/lerobot/.pins.sha256"
cmd=${1:?usage: env.sh setup|run DIR... -- ARGS|root}; shift

setup() {
  local want; want=$(sha256sum "$pins" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && chroot "$root" $py -c "import lerobot" 2>/dev/null; then
    return 0
  fi
  command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  mkdir -p "$(dirname "$root")"
  if [ ! -x "$root/usr/bin/python3" ]; then
    rm -rf "$root.partial"
    debootstrap --variant=minbase --include=python3,python3-venv,libpython3.13,ffmpeg,ca-certificates \
      trixie "$root.partial" >/dev/null
    mv "$root.partial" "$root"
  fi
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  [ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  [ -x "$root$py" ] || chroot "$root" python3 -m venv /opt/lerobot
  cp "$pins" "$root/opt/lerobot/constraints.txt"
  chroot "$root" env -u PIP_FIND_LINKS $py -m pip install -q --disable-pip-version-check \
    -c /opt/lerobot/constraints.txt \
    "lerobot[training,diffusion]==0.6.1" xxhash webdataset click s3fs "moto[server]" pytest pytest-timeout psutil
  chroot "$root" $py -c "import lerobot, torchcodec, accelerate, diffusers; print('lerobot', lerobot.__version__ if hasattr(lerobot, '__version__') else '0.6.1', 'ready')"
  echo "$want" > "$stamp"
}

case "$cmd" in
setup) setup ;;
root) echo "$root" ;;
run)
  dirs=(/tmp); while [ $# -gt 0 ] && [ "$1" != "--" ]; do dirs+=("$(cd "$1" && pwd)"); shift; done
  [ "${1:-}" = "--" ] && shift
  [ -x "$root$py" ] || { echo "env.sh: no LeRobot environment at $root; run: bash tests/lerobot/env.sh setup" >&2; exit 2; }
  cwd=/tmp  # the caller's directory when it is mounted inside, so relative paths mean the same
  for d in "${dirs[@]}"; do case "$PWD/" in "$d"/*) cwd=$PWD ;; esac; done
  binds=""
  for d in "${dirs[@]}"; do binds+="mkdir -p '$root$d' && mount --rbind '$d' '$root$d' && "; done
  # Environment: HOME and caches inside /tmp; offline (nothing is downloaded at run time).
  exec unshare --mount --propagation private bash -c "
    mount --rbind /proc '$root/proc' && mount --rbind /dev '$root/dev' && mount --rbind /sys '$root/sys' && $binds
    exec chroot '$root' env -C '$cwd' -u PIP_FIND_LINKS HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled \
      \"\$@\"" _ $py "$@" ;;
*) echo "usage: env.sh setup|run DIR... -- ARGS|root" >&2; exit 2 ;;
esac
