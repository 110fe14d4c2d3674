#!/usr/bin/env bash
# System packages the tests need: Graphviz (DAG pictures), Slurm and munge (the real
# test cluster). Installed with apt when running as root and they are missing; elsewhere
# it says what is missing and the tests that need it are skipped.
# Arguments pick packages (`install-system-deps.sh graphviz`, what `make dag` runs).
set -euo pipefail
want=" ${*:-graphviz slurm-wlm munge} "
need=()
[[ $want == *" graphviz "* ]] && ! command -v dot >/dev/null && need+=(graphviz)
[[ $want == *" slurm-wlm "* ]] && ! command -v slurmctld >/dev/null && need+=(slurm-wlm)
if [[ $want == *" munge "* ]] && ! { command -v munged >/dev/null && [ -x /usr/sbin/munged ]; }; then
    need+=(munge)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
    echo "not root or no apt-get: ${need[*]} missing (install with the system's package manager); the tests that need them are skipped" >&2
fi
