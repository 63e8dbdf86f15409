# "Hosts" on one machine, for the tests and benchmarks that span machines (sourced): network
# namespaces, each process started in them with its own hostname (a UTS namespace), so chorus
# sees separate machines.
#   netns_up            two hosts, $A and $B, joined by a veth pair (10.213.0.1 and 10.213.0.2)
#   hosts_up N          N hosts ${HOST_NS[i]} at ${HOST_IP[i]} (10.214.0.1 ...), each linked
#                       by a veth pair to a bridge in a switch namespace of its own
#   host_kill I         kills every process of host I (as a dead machine)
#   host_cut I / host_mend I   takes host I's link down (cut off: packets vanish) / up again
#   in_host NS NAME CMD...   runs CMD in namespace NS under hostname NAME
#   in_host_own_shm NS NAME LEFT CMD...   the same, with a /dev/shm of its own, whose chorus
#                       segments left at CMD's exit are listed in the file LEFT
#   hosts_report        every process left on the hosts and where its threads wait
# Both exit 77 (skipped) where namespaces cannot be made (no root, no iproute2 or util-linux) and
# remove everything again at exit.
A=chorus$$a B=chorus$$b
MASTER_IP=10.213.0.1

SWITCH=chorus$$sw
HOST_NS=() HOST_IP=()

netns_down() {
  for ns in $A $B "${HOST_NS[@]}" $SWITCH; do
    ip netns pids $ns 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del $ns 2>/dev/null
  done
}

netns_up() {
  netns_can $A
  netns_traps
  ip netns add $B &&
    ip link add ${A}v type veth peer name ${B}v &&
    ip link set ${A}v netns $A &&
    ip link set ${B}v netns $B &&
    ip -n $A addr add $MASTER_IP/24 dev ${A}v &&
    ip -n $B addr add 10.213.0.2/24 dev ${B}v || { echo "FAILED: setting up the veth pair"; exit 1; }
  for ns in $A $B; do
    ip -n $ns link set lo up && ip -n $ns link set ${ns}v up || { echo "FAILED: bringing up $ns"; exit 1; }
  done
}

# Removed at exit, and when the test is stopped (ctest's timeout sends SIGTERM).
netns_traps() {
  trap 'netns_down; eval "${netns_cleanup:-:}"' EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
}

netns_can() {
  if ! command -v ip >/dev/null || ! command -v unshare >/dev/null || ! ip netns add "$1" 2>/dev/null; then
    echo "SKIPPED: cannot create network namespaces here (needs root, iproute2 and util-linux)"
    exit 77
  fi
}

hosts_up() {
  local n=$1 i ns
  netns_can $SWITCH
  netns_traps
  ip -n $SWITCH link add br0 type bridge ||
    { echo "SKIPPED: cannot make a bridge here (no bridge support in this kernel)"; exit 77; }
  ip -n $SWITCH link set br0 up && ip -n $SWITCH link set lo up || { echo "FAILED: bringing up the bridge"; exit 1; }
  for ((i = 0; i < n; i++)); do
    ns=chorus$$h$i
    HOST_NS[i]=$ns HOST_IP[i]=10.214.0.$((i + 1))
    ip netns add $ns &&
      ip link add c$$h$i type veth peer name c$$p$i &&
      ip link set c$$h$i netns $ns &&
      ip link set c$$p$i netns $SWITCH &&
      ip -n $SWITCH link set c$$p$i master br0 &&
      ip -n $SWITCH link set c$$p$i up &&
      ip -n $ns addr add ${HOST_IP[i]}/24 dev c$$h$i &&
      ip -n $ns link set lo up && ip -n $ns link set c$$h$i up || { echo "FAILED: making host $i"; exit 1; }
  done
}

# Every process on the hosts, with what each thread waits in (the kernel's stack, and gdb's
# backtrace where gdb is installed): what a test shows when something there did not end.
hosts_report() {
  local ns pid tid
  for ns in "${HOST_NS[@]}" $A $B; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      echo "--- $ns: pid $pid: $(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null)"
      for tid in /proc/$pid/task/*; do
        echo "  thread ${tid##*/} ($(cat $tid/comm 2>/dev/null)): $(awk '{print $3}' $tid/stat 2>/dev/null) in $(cat $tid/wchan 2>/dev/null)"
      done
      command -v gdb >/dev/null && timeout 60 gdb -q -batch -p "$pid" -ex "thread apply all bt" 2>/dev/null | grep -E "^(Thread|#)"
    done
  done
}

host_kill() { ip netns pids "${HOST_NS[$1]}" | xargs -r kill -9; }
host_cut() { ip -n $SWITCH link set c$$p$1 down; }
host_mend() { ip -n $SWITCH link set c$$p$1 up; }

in_host() {
  local ns=$1 name=$2
  shift 2
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

# in_host_own_shm NS NAME LEFT CMD...: in_host, with a /dev/shm of CMD's own (as on a machine of its
# own: nothing another test or host puts there is seen), and when CMD exits, the chorus segments
# still there listed in the file LEFT. CMD's exit code is the exit code.
in_host_own_shm() {
  local ns=$1 name=$2 left=$3
  shift 3
  ip netns exec "$ns" unshare --uts --mount sh -c \
    'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname "$0" || exit 1
     left=$1; shift; "$@"; code=$?; ls /dev/shm | grep "^chorus-" > "$left"; exit $code' "$name" "$left" "$@"
}
