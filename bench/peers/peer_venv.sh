# Sourced by the peers' install scripts: a venv of its own for a peer, outside the repo.
#
#   source "$(dirname "$0")/peer_venv.sh"; peer_venv /work/peers/NAME
#
# peer_venv VENV makes VENV with $PYTHON (default python3.11) where it is missing, moves to /tmp (pip never sees
# the repo's own pyproject) and sets PY (its python), NICE and PIP (its pip, niced so the shared cores stay
# usable); installed DIST VERSION-PREFIX then says (exit 0) whether that distribution is in it.
peer_venv() {
    PYTHON=${PYTHON:-python3.11}
    NICE=(nice -n 10)
    cd /tmp
    if [[ ! -x "$1/bin/python" ]]; then
        mkdir -p "$(dirname "$1")"
        "$PYTHON" -m venv "$1"
    fi
    PY="$1/bin/python"
    PIP=("${NICE[@]}" "$PY" -m pip)
}

installed() {
    "$PY" - "$1" "$2" <<'PYEOF'
import sys, importlib.metadata as m
try:
    sys.exit(0 if m.version(sys.argv[1]).startswith(sys.argv[2]) else 1)
except m.PackageNotFoundError:
    sys.exit(1)
PYEOF
}
