#!/bin/sh
# Create the secret files compose.yaml needs, each a random value readable only by its owner.
# An existing file is kept: re-running never changes a password. Run once, before
# `docker compose up`:   sh docker/init-secrets.sh
set -eu
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
umask 077
mkdir -p "$dir"
for name in postgres-password pravega-password pravega-internal-password; do
    file="$dir/$name"
    if [ ! -s "$file" ]; then
        # 32 random bytes as hex: no quoting trouble in JDBC URLs, YAML or shells
        od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$file"
        echo "created $file"
    fi
    chmod 600 "$file"
done
