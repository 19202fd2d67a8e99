#!/bin/bash
# The package acceptance test, run inside a Debian VM booted with systemd
# (packaging/debvm_test.go). Each check prints a marker the host test
# parses: @@deb:pass STEP/CHECK@@ or @@deb:fail STEP/CHECK reason@@; the
# last line is @@deb:done@@. The VM powers off at the end, whatever happens.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export SYSTEMD_PAGER= SYSTEMD_COLORS=0 LC_ALL=C.UTF-8
exec 2>&1

step=none
begin() { step=$1; echo "=== step $step (at ${SECONDS}s)"; }
pass() { echo "@@deb:pass $step/$1@@"; }
fail() { echo "@@deb:fail $step/$1 ${2:-}@@"; }
# check NAME CMD...: pass if CMD succeeds; its output is shown either way.
check() {
	local name=$1 out rc
	shift
	out=$("$@" 2>&1); rc=$?
	[[ -n $out ]] && printf '%s\n' "$out" | sed 's/^/    /' | head -60
	if ((rc == 0)); then pass "$name"; else fail "$name" "exit $rc: $*"; fi
	return $rc
}
# wait_for SECONDS CMD...: poll until CMD succeeds.
wait_for() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		((SECONDS >= deadline)) && return 1
		sleep 0.5
	done
}
# readme_block MARKER: the fenced block under <!-- MARKER --> in the
# README (copied into the VM beside the steps), as written.
README=/usr/local/lib/deb-acceptance/README.md
readme_block() {
	awk -v m="<!-- $1 -->" '$0 == m {f = 1; next} f == 1 && /^```/ {f = 2; next} f == 2 && /^```/ {exit} f == 2 {print}' "$README"
}
# run_block MARKER: run the README's block as written, stopping at its
# first failing command. The VM is root and has no sudo: a sudo that runs
# its command stands in for it.
run_block() {
	local b
	b=$(readme_block "$1")
	[[ -n $b ]] || { echo "no block <!-- $1 --> in $README"; return 1; }
	if [[ ! -x /usr/local/sbin/sudo ]]; then
		printf '#!/bin/sh\nexec "$@"\n' > /usr/local/sbin/sudo
		chmod 0755 /usr/local/sbin/sudo
	fi
	printf '%s\n' "$b" | sed 's/^/    $ /'
	bash -e -c "$b"
}
finish() {
	echo "@@deb:done@@"
	sync
	systemctl poweroff --force --no-block
}
trap finish EXIT

is() { [[ $(systemctl is-active nodeagent) == "$1" ]]; }
restarts() { systemctl show -p NRestarts --value nodeagent; }
ifindex() { cat "/sys/class/net/$1/ifindex"; }
# write_config FILE: replace the config atomically, as an editor would.
write_config() { cat > /etc/nodeagent/.new.yaml && mv /etc/nodeagent/.new.yaml /etc/nodeagent/nodeagent.yaml; }

echo "kernel $(uname -r), $(systemctl --version | head -1)"

# The boot after the adopt step (testdata/steps/late), from the root it
# saved: only the checks of that boot.
if [[ -e /root/adopt-rebooted ]]; then
	. /usr/local/lib/deb-acceptance/05-topology.sh
	for f in /usr/local/lib/deb-acceptance/reboot/*.sh; do
		[[ -e $f ]] && . "$f"
	done
	exit 0
fi

# Another Debian's neighbours (packaging's TestNeighboursTrixieVM): the
# package installed, then only the steps /etc/deb-acceptance-only names.
if [[ -s /etc/deb-acceptance-only ]]; then
	begin install
	check dpkg-i dpkg -i /root/deb/nodeagent_*_amd64.deb
	echo "    $(networkctl --version | head -1); $(udevadm --version)"
	. /usr/local/lib/deb-acceptance/05-topology.sh
	for f in $(cat /etc/deb-acceptance-only); do
		. "/usr/local/lib/deb-acceptance/$f"
	done
	exit 0
fi

# --- 1. install ---------------------------------------------------------
begin install
deb=$(ls /root/deb/nodeagent_*_amd64.deb)
check dpkg-i dpkg -i "$deb"
check group getent group nodeagent
check enabled test "$(systemctl is-enabled nodeagent)" = enabled
check not-started test "$(systemctl is-active nodeagent)" = inactive
check default-config-validates nodeagent validate
check default-config-inert test "$(nodeagent plan)" = "no changes"
check conffile grep -q /etc/nodeagent/nodeagent.yaml /var/lib/dpkg/info/nodeagent.conffiles
check man-pages test -f /usr/share/man/man5/nodeagent.yaml.5.gz -a -f /usr/share/man/man8/nodeagent.8.gz -a -f /usr/share/man/man1/nodeagentctl.1.gz
check monitoring-examples test -f /usr/share/doc/nodeagent/examples/monitoring/nodeagent-alerts.yml -a -f /usr/share/doc/nodeagent/examples/monitoring/nodeagent-dashboard.json
check hook-example test -x /usr/share/doc/nodeagent/examples/hooks/qbittorrent-port -a -f /usr/share/doc/nodeagent/examples/hooks/README
check hook-example-runs sh -c '/usr/share/doc/nodeagent/examples/hooks/qbittorrent-port --help | grep -q "^usage: qbittorrent-port --url"'

# --- 2. start with a test config ------------------------------------------
begin start
ip link add trunk0 type dummy && ip link set trunk0 up
(umask 077; mkdir -p /etc/nodeagent/keys; wg genkey > /etc/nodeagent/keys/wg0.key; wg genkey > /etc/nodeagent/keys/wg1.key)
peer=$(wg genkey | wg pubkey)
config() {
	cat <<EOF
dad: {disabled: true}
sysctls: {net.ipv4.ip_forward: "1"}
vlans:
  - {name: trunk0.50, parent: trunk0, id: 50, addresses: [10.10.50.1/24]}
$1
wireguard:
  - name: wg0
    implementation: kernel
    privateKeyFile: /etc/nodeagent/keys/wg0.key
    listenPort: 51820
    addresses: [10.90.0.1/24]
    peersDir: /etc/nodeagent/peers.d
    peers:
      - {name: laptop, publicKey: $peer, allowedIPs: [10.90.0.2/32]}
  - name: wg1
    implementation: userspace
    privateKeyFile: /etc/nodeagent/keys/wg1.key
    listenPort: 51821
    addresses: [10.91.0.1/24]
${2:-}
routing:
  tables:
    - {id: 150, name: vlan50-egress, killSwitch: true, routes: [{to: default, dev: wg0}]}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
firewall:
  masquerade: [{from: 10.90.0.0/24, out: trunk0}]
  killSwitch: [{from: 10.10.50.0/24, allowOut: [wg0]}]
checks: {gatewayARP: false}
EOF
}
config "" | write_config
check test-config-validates nodeagent validate
# The test hook (SIGUSR2 wedges the loop) and a short watchdog for step 5.
mkdir -p /etc/systemd/system/nodeagent.service.d
printf '[Service]\nEnvironment=NODEAGENT_TEST_HOOKS=1\nWatchdogSec=6s\n' > /etc/systemd/system/nodeagent.service.d/test.conf
systemctl daemon-reload
# A peer file with a typo beside two good ones: the unit still starts
# (READY=1 is not held back by one bad file), degraded, naming file and line.
export good1=$(wg genkey | wg pubkey) good2=$(wg genkey | wg pubkey)
printf 'publicKey: %s\nallowedIPs: [10.90.0.3/32]\n' "$good1" > /etc/nodeagent/peers.d/good1.yaml
printf '[Peer]\nPublicKey = %s\nAllowedIPs = 10.90.0.4/32\n' "$good2" > /etc/nodeagent/peers.d/good2.conf
printf 'publicKey: %s\nallowedIPs: [10.90.0.300/32]\n' "$(wg genkey | wg pubkey)" > /etc/nodeagent/peers.d/bad.yaml
modules_before=$(ls /sys/module | tr '\n' ' ')
t0=$SECONDS
check systemctl-start systemctl start nodeagent
echo "    systemctl start took $((SECONDS - t0))s"
check degraded-by-bad-peer-file sh -c 'nodeagentctl status; test $? -eq 1'
check names-bad-file-line sh -c 'nodeagentctl status | grep -q "peers.d/bad.yaml:2: allowedIPs\[0\]"'
check good-peers sh -c 'wg show wg0 peers | grep -q "$good1" && wg show wg0 peers | grep -q "$good2"'
rm /etc/nodeagent/peers.d/bad.yaml
check bad-file-removed wait_for 20 nodeagentctl status
# Type=notify: start returns only after READY=1, so the unit is active
# (not activating) the moment it returns.
check active-after-start is active
check ready-status systemctl show -p StatusText -p NRestarts -p Result nodeagent
check nodeagentctl-status nodeagentctl status
check status-shows-wg0 sh -c 'nodeagentctl status | grep -q wg0'
check status-json sh -c 'nodeagentctl status -o json | grep -q "\"ready\": true"'
check vlan ip -d link show trunk0.50
check wg-kernel wg show wg0
# wg0 was filled at start-up through a staging device (nastg..., renamed
# to wg0 by the first sync, under udev): none is left behind.
check no-staging-device-left wait_for 20 sh -c '! ip -o link show | grep -q nastg'
check wg-userspace sh -c 'test -S /run/wireguard/wg1.sock && wg show wg1'
check rule sh -c 'ip rule show | grep "^1000:" | grep -q "lookup vlan50-egress"'
check route-proto sh -c 'ip route show table 150 | grep -q "proto nodeagent"'
check rt-tables-name grep -q vlan50-egress /etc/iproute2/rt_tables.d/nodeagent.conf
check masquerade sh -c 'nft list table inet nodeagent | grep -q masquerade'
check sysctl test "$(cat /proc/sys/net/ipv4/ip_forward)" = 1
check journal sh -c 'journalctl -u nodeagent --no-pager -o cat | grep -q "msg="'
# Under the journal: a start-up line with version and config, one when the
# node is ready, and no time= of our own (the journal stamps each line).
check journal-startup-line sh -c 'journalctl -u nodeagent --no-pager -o cat | grep -q "msg=starting version=.* config=/etc/nodeagent/nodeagent.yaml"'
check journal-ready-line sh -c 'journalctl -u nodeagent --no-pager -o cat | grep -q "msg=\"node ready\""'
check journal-no-own-time sh -c '! journalctl -u nodeagent --no-pager -o cat | grep -E "time=|^<[0-9]>"'
journalctl -u nodeagent --no-pager -o cat | head -40 | sed 's/^/    journal: /'
# ProtectKernelModules=yes: the daemon cannot load modules itself, but the
# kernel autoloads what its netlink requests need.
for m in 8021q wireguard nft_objref nft_masq; do
	case " $modules_before " in *" $m "*) echo "    $m was loaded before the start";; esac
	check "autoloaded-$m" test -d "/sys/module/$m"
done

# --- 3. reload ----------------------------------------------------------
begin reload
config "  - {name: trunk0.51, parent: trunk0, id: 51}" | write_config
check reload systemctl reload nodeagent
check applied wait_for 10 ip link show trunk0.51
check active-after-reload is active
printf 'vlans:\n  - {name: trunk0.52, parent: trunk0, id: 5000}\n' | write_config
if systemctl reload nodeagent; then fail broken-rejected "systemctl reload accepted a VLAN id 5000"; else pass broken-rejected; fi
sleep 1
check active-after-broken is active
check running-config-stays ip link show trunk0.51
check rejection-in-status sh -c 'nodeagentctl status -o json | grep -q lastRejected'
# The rejection is logged at a priority journalctl -p warning shows; the
# INFO lines around it are not.
check rejection-at-warning sh -c 'journalctl -u nodeagent -p warning --no-pager -o cat | grep "config rejected"'
check info-below-warning sh -c '! journalctl -u nodeagent -p warning --no-pager -o cat | grep -E "msg=\"(config loaded|node ready)\""'
check info-at-info sh -c 'journalctl -u nodeagent -p info..info --no-pager -o cat | grep -q "msg=\"node ready\""'
check journal-no-own-time sh -c '! journalctl -u nodeagent --no-pager -o cat | grep -E "time=|^<[0-9]>"'
config "  - {name: trunk0.51, parent: trunk0, id: 51}" | write_config
check reload-fixed systemctl reload nodeagent
check ready-again wait_for 20 nodeagentctl status

# --- 4. SIGKILL: restarted, objects re-adopted ---------------------------
begin kill
vlan_idx=$(ifindex trunk0.50) wg_idx=$(ifindex wg0) n0=$(restarts)
check kill systemctl kill -s KILL nodeagent
check restarted wait_for 60 sh -c "test \$(systemctl show -p NRestarts --value nodeagent) -gt $n0 && test \$(systemctl is-active nodeagent) = active"
check ready-again wait_for 30 nodeagentctl status
check vlan-ifindex-unchanged test "$(ifindex trunk0.50)" = "$vlan_idx"
check wg-ifindex-unchanged test "$(ifindex wg0)" = "$wg_idx"
systemctl show -p NRestarts -p ExecMainStatus nodeagent | sed 's/^/    /'

# --- 5. watchdog ----------------------------------------------------------
begin watchdog
n0=$(restarts)
check wedge systemctl kill -s USR2 --kill-who=main nodeagent
check restarted wait_for 60 sh -c "test \$(systemctl show -p NRestarts --value nodeagent) -gt $n0 && test \$(systemctl is-active nodeagent) = active"
check watchdog-fired sh -c 'journalctl -u nodeagent --no-pager -o cat | grep -i "watchdog timeout"'
check ready-again wait_for 30 nodeagentctl status
check vlan-ifindex-unchanged test "$(ifindex trunk0.50)" = "$vlan_idx"

# --- 6. metrics: NODEAGENT_METRICS from /etc/default/nodeagent ------------
begin metrics
# scrape: GET /metrics over bash's /dev/tcp (the VM has no curl).
scrape() {
	exec 3<>/dev/tcp/127.0.0.1/9477 || return 1
	printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
	cat <&3
	exec 3<&-
}
export -f scrape
check default-file-conffile grep -q /etc/default/nodeagent /var/lib/dpkg/info/nodeagent.conffiles
check default-file-inert sh -c '! grep -v "^#" /etc/default/nodeagent | grep -q .'
check off-by-default sh -c '! ss -Hltn "sport = :9477" | grep -q .'
echo 'NODEAGENT_METRICS=127.0.0.1:9477' >> /etc/default/nodeagent
check restart systemctl restart nodeagent
check active-after-restart is active
check listening wait_for 20 sh -c 'ss -Hltn "sport = :9477" | grep -q 127.0.0.1:9477'
check answers wait_for 20 bash -c "scrape > /root/metrics.out; grep -q '^HTTP/1.[01] 200' /root/metrics.out && grep -q '^nodeagent_ready 1' /root/metrics.out"
# wg0 is a remote-access device whose peers are all offline: peers, none
# live, and no tunnel health to read as down.
check wg0-peers grep -E '^nodeagent_wireguard_peers\{device="wg0"\} [1-9]' /root/metrics.out
check wg0-idle-no-tunnel-health sh -c '! grep "^nodeagent_tunnel_healthy" /root/metrics.out'
check ready-again wait_for 30 nodeagentctl status

# --- 7. PIA: registers against the stub, survives a restart -------------
begin pia
# The stub (testenv/piastub/cmd/piastub) runs in namespaces of its own,
# linked to this one; it writes the files a config trusts it by.
piastub /etc/nodeagent/piastub > /var/log/piastub.log 2>&1 &
stub_pid=$!
check stub-ready wait_for 60 test -e /etc/nodeagent/piastub/ready
. /etc/nodeagent/piastub/env
install -m 0600 /etc/nodeagent/piastub/pia.cred /etc/nodeagent/pia.cred
addkeys() { sed -n 's/.*addKey=\([0-9]*\).*/\1/p' /etc/nodeagent/piastub/counts; }
pia_healthy() { nodeagentctl status -o json | grep -q '"phase": "healthy"'; }
config "" "  - name: wg-pia
    pia:
      region: $PIA_REGION
      credentialsFile: /etc/nodeagent/pia.cred
      serverList: $PIA_LIST_URL
      tokenURL: $PIA_TOKEN_URL
      caFile: $PIA_CA
      serverListKeyFile: $PIA_LISTKEY
      webCAFile: $PIA_WEBCA" | write_config
check validates nodeagent validate
check reload systemctl reload nodeagent
check healthy wait_for 60 pia_healthy
check status-table sh -c 'nodeagentctl status | grep -A3 "^PIA wg-pia: healthy"'
check one-addkey test "$(addkeys)" = 1
check tunnel-healthy-metric bash -c "scrape | grep -E '^nodeagent_tunnel_healthy\{device=\"wg-pia\",kind=\"pia\"\} 1'"
check wg-kernel sh -c 'ip -d link show wg-pia | grep -q wireguard'
check handshake sh -c 'wg show wg-pia latest-handshakes | awk "{exit !(\$2 > 0)}"'
check state-dir-0700 test "$(stat -c %a /var/lib/nodeagent)" = 700
check pia-dir-0700 test "$(stat -c %a /var/lib/nodeagent/pia)" = 700
check registration-0600 test "$(stat -c %a /var/lib/nodeagent/pia/wg-pia.json)" = 600
check key-0600 test "$(stat -c %a /var/lib/nodeagent/pia/wg-pia.key)" = 600
pia_idx=$(ifindex wg-pia)
check restart systemctl restart nodeagent
check active-after-restart is active
check healthy-after-restart wait_for 60 pia_healthy
check no-new-addkey test "$(addkeys)" = 1
check pia-ifindex-unchanged test "$(ifindex wg-pia)" = "$pia_idx"
journalctl -u nodeagent --no-pager -o cat | grep -i 'subsystem=pia' | tail -8 | sed 's/^/    journal: /'
check no-token-in-journal sh -c '! journalctl -u nodeagent --no-pager -o cat | grep -qE "[0-9a-f]{128}"'
kill "$stub_pid"; wait "$stub_pid"

# --- udev ---------------------------------------------------------------
# udev's 99-default.link (MACAddressPolicy=persistent) rewrites the address
# of a link made with a random one, shortly after it appears. nodeagent
# gives a macvlan its address in the create message (derived from the
# machine id and its name), which udev leaves alone: the link never has
# another address (ip monitor sees every one it has, from its creation on),
# and the same one after a delete and re-create and after a restart.
begin udev
mac_of() { cat "/sys/class/net/$1/address"; }
check udevd-running systemctl is-active --quiet systemd-udevd
ip -o monitor link > /root/udev-monitor.log 2>&1 &
mon=$!
sleep 0.5
# every address shim0 had since the monitor started, one per line
seen() { grep -w shim0 /root/udev-monitor.log | grep -o 'link/ether [0-9a-f:]*' | awk '{print $2}' | sort -u; }
config "macvlans:
  - {name: shim0, parent: trunk0, addresses: [10.10.60.3/24]}" | write_config
check shim-created wait_for 20 test -e /sys/class/net/shim0
first=$(mac_of shim0)
echo "    shim0 made with $first"
check given-not-random test "$(cat /sys/class/net/shim0/addr_assign_type)" = 3
check locally-administered-unicast sh -c "test \$(( 0x${first%%:*} & 3 )) -eq 2"
sleep 2
check kept-after-2s test "$(mac_of shim0)" = "$first"
check one-address-since-creation test "$(seen)" = "$first"
ip link del shim0
check recreated wait_for 20 test -e /sys/class/net/shim0
sleep 2
check same-after-recreate test "$(mac_of shim0)" = "$first"
check restart systemctl restart nodeagent
check active-after-restart is active
sleep 2
check same-after-restart test "$(mac_of shim0)" = "$first"
check one-address-throughout test "$(seen)" = "$first"
kill "$mon"
seen | sed 's/^/    shim0 had /'

# --- the neighbours: networkd, udev on the wire, NetworkManager -----------
# Each is a file of its own (testdata/steps, in name order), sourced here
# with this script's helpers; each begins its own step.
for f in /usr/local/lib/deb-acceptance/*.sh; do
	[[ -e $f ]] && . "$f"
done

# --- 8. systemd-analyze security -------------------------------------------
begin security
systemd-analyze security --no-pager nodeagent.service | sed 's/^/    /'
score=$(systemd-analyze security --no-pager nodeagent.service | grep -o 'Overall exposure level for nodeagent.service: [0-9.]* [A-Z]*')
echo "@@deb:score ${score##*: }@@"
check printed test -n "$score"

# --- 9. purge -------------------------------------------------------------
begin purge
check purge sh -c 'dpkg --purge nodeagent > /root/purge.out 2>&1; rc=$?; cat /root/purge.out; exit $rc'
check stopped sh -c '! systemctl is-active --quiet nodeagent'
check unit-gone test ! -e /lib/systemd/system/nodeagent.service
check config-gone test ! -e /etc/nodeagent/nodeagent.yaml
check state-gone test ! -e /var/lib/nodeagent
check rt-names-gone test ! -e /etc/iproute2/rt_tables.d/nodeagent.conf
# The operator's keys, peer files and PIA credentials survive a purge, and
# it says so; prerm says how the kernel state it leaves is removed.
check key-kept test -s /etc/nodeagent/keys/wg0.key
check peer-file-kept test -s /etc/nodeagent/peers.d/good1.yaml
check cred-kept test -s /etc/nodeagent/pia.cred
check says-kept sh -c 'grep -q "purge kept" /root/purge.out && grep -q "^nodeagent:   /etc/nodeagent/keys/wg0.key$" /root/purge.out'
check says-teardown grep -q "run 'nodeagent teardown' before removing" /root/purge.out
check kernel-vlan-stays ip link show "$VLAN"
check kernel-wg-stays ip link show wg0
check kernel-nft-stays nft list table inet nodeagent
check kernel-rule-stays sh -c 'ip rule show | grep -q "^1000:"'
# teardown is the explicit way: reinstall (not started), tear down, purge.
check reinstall dpkg -i "$deb"
check teardown nodeagent teardown
check vlan-gone sh -c "! ip link show $VLAN"
check wg-gone sh -c '! ip link show wg0'
check nft-gone sh -c '! nft list table inet nodeagent'
check rule-gone sh -c '! ip rule show | grep -q "^1000:"'
check foreign-trunk-stays ip link show trunk0
check purge-again dpkg --purge nodeagent

# --- after the purge: a node set up the old way, adopted (testdata/steps/late)
for f in /usr/local/lib/deb-acceptance/late/*.sh; do
	[[ -e $f ]] && . "$f"
done
