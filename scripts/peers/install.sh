# Installing what the peer comparisons need, shared by scripts/peers/compare_peers.sh and
# scripts/peers/compare_tcp.sh (sourced, not run). The caller sets INSTALL (1: may install), LOG
# (where the tools' output goes), VENV and PY (the venv and its python) and defines `say`.

SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo -n)
APT_UPDATED=0

# apt_install PKG...: 0 when installed; `apt-get update` runs only when the first install fails.
apt_install() {
    [ "$INSTALL" = 1 ] || return 1
    command -v apt-get >/dev/null || return 1
    say "installing $* (apt; log in $LOG)"
    local apt=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900)
    "${apt[@]}" install -y --no-install-recommends "$@" >>"$LOG" 2>&1 && return 0
    [ "$APT_UPDATED" = 0 ] || return 1
    APT_UPDATED=1
    "${apt[@]}" update >>"$LOG" 2>&1 || say "apt-get update failed (going on with the old lists)"
    "${apt[@]}" install -y --no-install-recommends "$@" >>"$LOG" 2>&1
}

# vpy CODE: whether the venv's python runs CODE.
vpy() { "$PY" -c "$1" >/dev/null 2>&1; }

pip_install() { say "pip install $* (log in $LOG)"; "$PY" -m pip install --disable-pip-version-check "$@" >>"$LOG" 2>&1; }

# ensure_venv: 0 when the venv exists (created here when INSTALL=1, with python3-venv from apt
# where the first try fails).
ensure_venv() {
    [ -x "$PY" ] && return 0
    [ "$INSTALL" = 1 ] || return 1
    say "creating the venv $VENV"
    python3 -m venv "$VENV" >>"$LOG" 2>&1 && return 0
    rm -rf "$VENV"
    apt_install python3-venv && python3 -m venv "$VENV" >>"$LOG" 2>&1
}
