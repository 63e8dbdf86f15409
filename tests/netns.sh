# Two "hosts" on one machine, for tests/two_hosts.sh and bench/two_hosts_bench.sh (sourced):
# network namespaces $A and $B joined by a veth pair (10.213.0.1 and 10.213.0.2), each process
# started in them with its own hostname (a UTS namespace), so chorus sees two machines.
#   netns_up            makes them; exits 77 (skipped) where that is impossible (no root, no
#                       iproute2 or util-linux); removes them again at exit
#   in_host NS NAME CMD...   runs CMD in namespace NS under hostname NAME
A=chorus$$a B=chorus$$b
MASTER_IP=10.213.0.1

netns_down() {
  for ns in $A $B; do
    ip netns pids $ns 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del $ns 2>/dev/null
  done
}

netns_up() {
  if ! command -v ip >/dev/null || ! command -v unshare >/dev/null || ! ip netns add $A 2>/dev/null; then
    echo "SKIPPED: cannot create network namespaces here (needs root, iproute2 and util-linux)"
    exit 77
  fi
  trap 'netns_down; eval "${netns_cleanup:-:}"' EXIT
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

in_host() {
  local ns=$1 name=$2
  shift 2
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}
