# cluster-lib.sh: shell helpers to run a local psd cluster (sourced by demo.sh and
# bench scripts). Expects $bin (the build dir) and $tmp (a scratch dir); keeps
# the started psd pids in the array psd_pids.

# A free port below the kernel's ephemeral range (where every outgoing connection takes its
# local port: one picked there could be taken before psd binds it, "cannot listen ... Device is
# busy", seen once), one that binds now (python3, which setup.sh installs; else: nothing
# answers a connect on it), and none of the ports named in "$@".
free_port() {
    local lo=32768 top bottom p t taken
    { read -r lo _ </proc/sys/net/ipv4/ip_local_port_range; } 2>/dev/null || lo=32768
    top=32768 # as tests/integration/cluster.c's pick_port
    [ "$lo" -gt 1024 ] 2>/dev/null && top=$lo
    bottom=1024
    [ "$top" -gt 13024 ] && bottom=$((top - 12000))
    while :; do
        p=$((bottom + RANDOM % (top - bottom)))
        taken=0
        for t in "$@"; do [ "$t" = "$p" ] && taken=1; done
        [ "$taken" = 1 ] && continue
        if command -v python3 >/dev/null 2>&1; then
            python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' \
                "$p" 2>/dev/null && { echo "$p"; return; }
        else
            (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
        fi
    done
}

# write_servers NSHARDS DIR: the manifest's servers: block, data under DIR.
write_servers() {
    local i ports=()
    echo "servers:"
    for ((i = 0; i < $1; i++)); do
        ports+=("$(free_port "${ports[@]}")")
        echo "  - {host: 127.0.0.1, port: ${ports[$i]}, data_dir: $2/shard$i}"
    done
}

# write_demo_job WORKERS EPOCHS: the demo's job: block (Fashion-MNIST MLP, BSP, Adam).
write_demo_job() {
    cat <<YAML
job:
  model: mlp
  layers: [784, 256, 128, 10]
  dataset: /usr/share/datasets/fashion-mnist
  batch_size: 64
  epochs: $2
  seed: 1
  workers: $1
  consistency: bsp
  optimizer: {name: adam, lr: 0.001, beta1: 0.9, beta2: 0.999, eps: 1.0e-8}
YAML
}

# start_shards MANIFEST NSHARDS: start every psd and wait for its "listening" line.
start_shards() {
    local i
    psd_pids=()
    for ((i = 0; i < $2; i++)); do
        "$bin/server/psd" --manifest "$1" --shard "$i" >"$tmp/psd$i.out" 2>"$tmp/psd$i.log" &
        psd_pids+=($!)
    done
    for ((i = 0; i < $2; i++)); do
        for _ in $(seq 100); do
            grep -q listening "$tmp/psd$i.out" 2>/dev/null && break
            kill -0 "${psd_pids[$i]}" 2>/dev/null || break
            sleep 0.1
        done
        if ! grep -q listening "$tmp/psd$i.out" 2>/dev/null; then
            echo "psd shard $i did not start:" >&2
            cat "$tmp/psd$i.log" >&2
            return 1
        fi
    done
}

# stop_shards: SIGTERM every psd started by start_shards and wait for it.
stop_shards() {
    local p
    for p in "${psd_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${psd_pids[@]}"; do wait "$p" 2>/dev/null; done
    psd_pids=()
}
