#!/usr/bin/env bash
# Collectives across "hosts" (network namespaces on a bridge, tests/netns.sh), each layout H hosts
# x R ranks: chorus's automatic choice (chorusrun + chorus-bench) against torch's gloo (torchrun +
# bench/torch_hosts.py) on the same hosts, the implementations interleaved and each run REPEAT
# times; the table is the median of the runs of rank 0's median. Needs root (namespaces).
# Implementations (--impls): chorus (auto: tcp between hosts), gloo (torch's), chorus-gloo and
# chorus-mpi (chorus-bench with CHORUS_BACKEND=gloo, or =mpi under Open MPI's mpirun, which
# starts its daemons inside the namespaces through a plm_rsh_agent), before (--before's build).
#
# Usage: bench/hosts_bench.sh [options]
#   --build DIR        chorus's build (default: build)
#   --before DIR       also run the chorus-bench of another build, as "before" (a change measured
#                      against the code before it, in the same run)
#   --layouts LIST     HxR,... (default 2x2,3x2,4x1)
#   --ops LIST         default barrier,all_reduce,broadcast,all_gather,reduce_scatter
#   --sizes LIST       bytes per rank (default 8,1024,65536,1048576,4194304,16777216,67108864)
#   --repeat N         runs of each implementation (default 3)
#   --impls LIST       default chorus,gloo
#   --csv FILE         every run's rows (layout,impl,run,op,bytes,median_us) go there too
#   --env K=V          for chorus's runs (repeatable), e.g. --env CHORUS_CROSS_ALGORITHM=ring
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build before="" layouts=2x2,3x2,4x1 repeat=3 csv="" impls=chorus,gloo
ops=barrier,all_reduce,broadcast,all_gather,reduce_scatter
sizes=8,1024,65536,1048576,4194304,16777216,67108864
chorus_env=()
while (($#)); do
  case $1 in
    --build) build=$(realpath "$2"); shift 2 ;;
    --before) before=$(realpath "$2"); shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --impls) impls=$2; shift 2 ;;
    --csv) csv=$(realpath -m "$2"); shift 2 ;;
    --env) chorus_env+=("$2"); shift 2 ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "hosts_bench.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
py=${CHORUS_PYTHON:-"$root/.venv/bin/python"}
out=$(mktemp -d)
netns_cleanup='rm -rf "$out"'
source "$root/tests/netns.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
port=$((30000 + $$ % 10000))
rows=$out/rows.csv
echo "layout,impl,run,op,bytes,median_us" > "$rows"

# mpirun's daemons start in the namespaces: the agent maps each host name to its namespace.
printf '%s\n' '#!/bin/sh' 'host=$1; shift' "ns=\$(grep \"^\$host \" $out/hosts.map | cut -d' ' -f2)" \
  'exec ip netns exec "$ns" unshare --uts sh -c '"'"'hostname "$0"; exec sh -c "$1"'"'"' "$host" "$*"' > "$out/agent.sh"
chmod +x "$out/agent.sh"

# launch IMPL H R RUN: one launcher per host (chorus-mpi: one mpirun in host 0), node 0's table
# parsed into $rows.
launch() {
  local impl=$1 h=$2 r=$3 run=$4 i pids=() ok=1
  port=$((port + 1))
  if [[ $impl == chorus-mpi ]]; then
    : > "$out/hosts.map"
    : > "$out/hostfile"
    for ((i = 0; i < h; i++)); do
      echo "h$i ${HOST_NS[i]}" >> "$out/hosts.map"
      echo "h$i slots=$r" >> "$out/hostfile"
    done
    local list=${HOST_IP[0]%.*}.0/24  # the hosts' subnet (each host has its own interface name)
    in_host ${HOST_NS[0]} h0 env CHORUS_BACKEND=mpi MASTER_ADDR=${HOST_IP[0]} MASTER_PORT=$port \
      mpirun --allow-run-as-root --hostfile "$out/hostfile" -np $((h * r)) --mca plm_rsh_agent "$out/agent.sh" \
      --mca btl_tcp_if_include "$list" --mca oob_tcp_if_include "$list" \
      -x CHORUS_BACKEND -x MASTER_ADDR -x MASTER_PORT -x OMP_NUM_THREADS \
      "$build/bench/chorus-bench" --ops $ops --sizes $sizes > "$out/$impl.0" 2>&1 || ok=0
  fi
  for ((i = 0; i < h; i++)); do
    [[ $impl == chorus-mpi ]] && break
    local common=(--nnodes $h --node-rank $i --master-addr ${HOST_IP[0]} --master-port $port --nproc-per-node $r)
    local cmd
    case $impl in
      chorus | before | chorus-gloo)
        local b=$build extra=()
        [[ $impl == before ]] && b=$before
        [[ $impl == chorus-gloo ]] && extra=(CHORUS_BACKEND=gloo)
        cmd=(env "${chorus_env[@]}" "${extra[@]}" "$b/launcher/chorusrun" --no-prefix "${common[@]}"
             "$b/bench/chorus-bench" --ops $ops --sizes $sizes) ;;
      gloo)
        cmd=(env GLOO_SOCKET_IFNAME=c$$h$i "$py" -m torch.distributed.run "${common[@]}"
             "$root/bench/torch_hosts.py" --ops $ops --sizes $sizes) ;;
    esac
    in_host ${HOST_NS[i]} h$i "${cmd[@]}" > "$out/$impl.$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p || ok=0; done
  if ((!ok)); then
    echo "FAILED: $impl on ${h}x$r (run $run):"
    tail -n 20 "$out/$impl".*
    return 1
  fi
  "$py" - "$out/$impl.0" "${h}x$r" $impl $run "$ops" >> "$rows" <<'PY'
import sys
path, layout, impl, run, ops = sys.argv[1:]
for line in open(path):
    f = line.split()
    if len(f) >= 3 and f[0] in ops.split(",") and f[1].isdigit():
        print(f"{layout},{impl},{run},{f[0]},{f[1]},{f[2]}")
PY
}

IFS=, read -ra impls <<< "$impls"
[[ -n $before ]] && impls=(before "${impls[@]}")
IFS=, read -ra layout_list <<< "$layouts"
for layout in "${layout_list[@]}"; do
  h=${layout%x*} r=${layout#*x}
  hosts_up $h
  for ((run = 1; run <= repeat; run++)); do
    for impl in "${impls[@]}"; do
      echo "== ${h} hosts x $r ranks: $impl, run $run of $repeat" >&2
      launch $impl $h $r $run || exit 1
    done
  done
  netns_down
  HOST_NS=() HOST_IP=()
done
[[ -n $csv ]] && cp "$rows" "$csv"

"$py" - "$rows" <<'PY'
import csv, statistics, sys
from collections import defaultdict
runs = defaultdict(list)
impls = []
for row in csv.DictReader(open(sys.argv[1])):
    runs[row["layout"], row["op"], int(row["bytes"]), row["impl"]].append(float(row["median_us"]))
    if row["impl"] not in impls:
        impls.append(row["impl"])
med = {k: statistics.median(v) for k, v in runs.items()}
layouts = list(dict.fromkeys(k[0] for k in med))
others = [i for i in impls if i != "gloo"]
for layout in layouts:
    h, r = layout.split("x")
    print(f"\n## {h} hosts x {r} ranks: median of {max(len(v) for v in runs.values())} runs of rank 0's median, µs;"
          " ratio = torch gloo's time / that")
    head = f"| op | bytes | " + " | ".join(others + ["torch gloo"]) + " | " + " | ".join(f"{i} ratio" for i in others) + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for key in sorted({(k[1], k[2]) for k in med if k[0] == layout}, key=lambda k: (k[0] != "barrier", k[0], k[1])):
        op, b = key
        g = med.get((layout, op, b, "gloo"))
        cells = [f"{med[(layout, op, b, i)]:.1f}" if (layout, op, b, i) in med else "-" for i in others]
        ratios = [f"{g / med[(layout, op, b, i)]:.2f}x" if g and (layout, op, b, i) in med else "-" for i in others]
        print(f"| {op} | {b} | " + " | ".join(cells) + f" | {f'{g:.1f}' if g else '-'} | " + " | ".join(ratios) + " |")
PY
