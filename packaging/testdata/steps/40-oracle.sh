# --- oracle: networkd itself judges nodeagent's reading of .network files -----
# nodeagent runs the gateway config with a macvlan shim on its VLAN (the
# VLAN also has an alternative name, trunk50) and kernel wg0. networkd 252
# runs with the shipped drop-in (it leaves foreign routing alone). Each
# shape of netcfg/hazard/testdata/networkd (copied to SHAPES) is written,
# networkd reloads (networkctl reload), and what `networkctl list` says of
# each of nodeagent's links (unmanaged or not) is compared with what
# nodeagent's Coexistence condition says of it (a .network file catches
# it, or not). Then the files netplan 0.106 generates for a YAML that
# matches the uplink by MAC (with and without set-name) and for one that
# declares the VLAN. The table of shapes and both verdicts is printed; any
# disagreement fails. The fixture's expectation (the hazard package's
# test) is printed beside them.
begin oracle
SHAPES=/usr/local/lib/deb-acceptance/shapes
oracle_links="$VLAN shim0 wg0"
ip netns list | grep -qw wan || check topology topo_up
gateway_config "macvlans:
  - {name: shim0, parent: $VLAN, addresses: [10.10.50.3/24]}" | write_config
check validates nodeagent validate
if is active; then
	check reload systemctl reload nodeagent
else
	check start systemctl start nodeagent
fi
check ready wait_for 30 nodeagentctl status
check shim-on-vlan wait_for 20 sh -c "ip -d link show shim0 | grep -q 'shim0@$VLAN'"
ip link property add dev "$VLAN" altname trunk50 2>/dev/null
check altname sh -c "ip link show $VLAN | grep -q 'altname trunk50'"
mkdir -p /etc/systemd/networkd.conf.d /etc/systemd/network
cp /usr/share/doc/nodeagent/examples/networkd.conf.d/nodeagent.conf /etc/systemd/networkd.conf.d/nodeagent.conf
check networkd-start systemctl start systemd-networkd
check networkd-bus wait_for 20 busctl --system status org.freedesktop.network1
# What nodeagent and networkd see of its links.
for l in $oracle_links; do
	echo "    $l: $(grep DEVTYPE /sys/class/net/$l/uevent) type $(cat /sys/class/net/$l/type) $(udevadm info -q property /sys/class/net/$l | grep -E '^(ID_NET_DRIVER|ID_PATH)=' | tr '\n' ' ')"
done
hostname=$(hostname)
mac=$(cat "/sys/class/net/$VLAN/address")
shimmac=$(cat /sys/class/net/shim0/address)

# written: the files the last shape wrote, removed before the next.
written=()
oracle_clean() {
	local f
	for f in "${written[@]}"; do rm -rf "$f"; done
	written=()
	rm -rf /etc/systemd/network/*.network.d /run/systemd/network/*.network.d /usr/lib/systemd/network/50-x.network.d
}
# oracle_write SHAPE: write its files, as the hazard package's test does.
oracle_write() {
	local path= mode= target=
	while IFS= read -r line; do
		case $line in
		'#'* | 'want: '* | fixture-only) [[ -z ${path:-} ]] && continue ;;
		esac
		case $line in
		'file '*)
			read -r _ path _ mode <<< "$line"
			path="${ORACLE_ROOT:-}/$path"
			mkdir -p "$(dirname "$path")"
			: > "$path"
			chmod "${mode:-0644}" "$path"
			written+=("$path")
			[[ $path == *.network ]] && tails+=("$path")
			continue ;;
		'link '*)
			read -r _ path target <<< "$line"
			path="${ORACLE_ROOT:-}/$path"
			mkdir -p "$(dirname "$path")"
			ln -sf "$target" "$path"
			written+=("$path")
			path=
			continue ;;
		esac
		[[ -n ${path:-} ]] || continue
		line=${line//@MAC@/$mac}
		line=${line//@SHIMMAC@/$shimmac}
		line=${line//@HOST@/$hostname}
		printf '%s\n' "$line" >> "$path"
	done < "$1"
	local t
	for t in "${tails[@]}"; do
		printf '[Network]\nKeepConfiguration=yes\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' >> "$t"
	done
	tails=()
}
# networkd_settled: none of nodeagent's links is pending or configuring;
# what networkctl list said is kept in $nd_list.
networkd_settled() {
	nd_list=$(networkctl list --no-legend --no-pager) || return 1
	! awk -v links=" $oracle_links " 'index(links, " " $2 " ") && $5 ~ /^(pending|initialized|configuring)$/ {bad=1} END {exit !bad}' <<< "$nd_list"
}
# networkd_verdict LINK: managed or unmanaged, by what networkctl list
# said when networkd had settled ($nd_list).
networkd_verdict() {
	awk -v l="$1" '$2 == l {print ($5 == "unmanaged") ? "unmanaged" : "managed(" $5 ")"}' <<< "$nd_list"
}
# nodeagent_caught: nodeagent's links its Coexistence condition says a
# .network file catches, in one line.
nodeagent_caught() {
	local msg l out=""
	msg=$(nodeagentctl status -o json | grep -A3 '"type": "Coexistence"' | grep '"message"')
	for l in $oracle_links; do
		[[ $msg == *"catches nodeagent's link $l, which networkd"* ]] && out+="$l "
	done
	echo "${out% }"
}
oracle_row() { printf '    %-34s %-10s %-22s %-10s %s\n' "$@"; }
oracle_row SHAPE LINK NETWORKD NODEAGENT FIXTURE
shapes=0 rows=0 disagree=0
# oracle_check NAME WANT [KNOWN]: compare the two verdicts for every link;
# WANT is the fixture's expectation when KNOWN is 1.
oracle_check() {
	local name=$1 want=$2 known=${3:-0} caught l nd na fx try
	local deadline=$((SECONDS + 15))
	until networkd_settled; do
		((SECONDS >= deadline)) && { echo "    $name: networkd did not settle"; break; }
		sleep 0.2
	done
	# nodeagent looked again as the files were written, before networkd
	# reloaded; a disagreement is read once more, a second later, before
	# it counts.
	caught=$(nodeagent_caught)
	for l in $oracle_links; do
		for try in 1 2; do
			nd=$(networkd_verdict "$l")
			na=ignores
			[[ " $caught " == *" $l "* ]] && na=catches
			if [[ -n $nd ]] && { [[ $nd == unmanaged && $na == ignores ]] || [[ $nd == managed* && $na == catches ]]; }; then
				break
			fi
			((try == 1)) && { sleep 1; networkd_settled; caught=$(nodeagent_caught); }
		done
		fx=-
		((known)) && { fx=ignores; [[ " $want " == *" $l "* ]] && fx=catches; }
		oracle_row "$name" "$l" "${nd:-?}" "$na" "$fx"
		rows=$((rows + 1))
		if [[ $nd == unmanaged && $na == catches ]] || [[ $nd == managed* && $na == ignores ]] || [[ -z $nd ]]; then
			disagree=$((disagree + 1))
			fail "$name-$l" "networkd ${nd:-?}, nodeagent $na"
		fi
	done
	shapes=$((shapes + 1))
}

oracle_t0=$SECONDS
for shape in "$SHAPES"/*.shape; do
	name=$(basename "$shape" .shape)
	grep -qx fixture-only "$shape" && continue
	want=$(sed -n 's/^want: //p' "$shape"); [[ $want == - ]] && want=""
	oracle_clean
	tails=()
	oracle_write "$shape"
	networkctl reload
	oracle_check "$name" "$want" 1
done
oracle_clean

# netplan 0.106: the files `netplan generate` writes.
netplan_shape() {
	local name=$1
	rm -f /etc/netplan/*.yaml
	cat > "/etc/netplan/50-$name.yaml"
	chmod 600 "/etc/netplan/50-$name.yaml"
	netplan generate
	ls -l /run/systemd/network/ | grep netplan | sed "s/^/    $name: /"
	for f in /run/systemd/network/10-netplan-*; do
		sed "s|^|    $name: $(basename "$f"): |" "$f"
	done
	networkctl reload
	oracle_check "$name" ""
	rm -f /etc/netplan/*.yaml /run/systemd/network/10-netplan-*
}
netplan_shape netplan-mac-set-name <<YAML
network:
  version: 2
  renderer: networkd
  ethernets:
    uplink:
      match: {macaddress: "$mac"}
      set-name: $TRUNK
      dhcp4: false
YAML
netplan_shape netplan-mac <<YAML
network:
  version: 2
  renderer: networkd
  ethernets:
    uplink:
      match: {macaddress: "$mac"}
      dhcp4: false
YAML
netplan_shape netplan-vlan <<YAML
network:
  version: 2
  renderer: networkd
  ethernets:
    $TRUNK: {dhcp4: false}
  vlans:
    $VLAN: {id: 50, link: $TRUNK, dhcp4: false}
YAML
networkctl reload
echo "    $shapes shapes, $rows verdicts, $disagree disagreements ($((SECONDS - oracle_t0)) s)"
check forty-shapes test "$shapes" -ge 40
check no-disagreement test "$disagree" = 0
check all-unmanaged-after sh -c "for l in $oracle_links; do networkctl list --no-legend --no-pager | awk -v l=\$l '\$2 == l' | grep -q unmanaged || exit 1; done"
# The fix offered is networkd's own: Unmanaged=yes in a file that sorts
# first (the shape 27-unmanaged-file-first checked it works).
printf '[Match]\nName=*\n[Network]\nKeepConfiguration=yes\n' > /etc/systemd/network/50-all.network
check fix-offered wait_for 10 sh -c "nodeagentctl status -o json | grep -q '00-nodeagent.network with \\[Match\\] Name=$VLAN shim0 wg0 and \\[Link\\] Unmanaged=yes'"
nodeagentctl status -o json | grep -o '50-all.network: its \[Match\][^;]*; [^;]*' | head -1 | sed 's/^/    condition: /'
# networkd found by its bus name: stopped (its bus name gone), its files
# catch nothing.
check networkd-stop sh -c 'systemctl stop systemd-networkd.socket systemd-networkd'
check gone-when-stopped wait_for 20 sh -c '! nodeagentctl status -o json | grep -q 50-all.network'
rm -f /etc/systemd/network/50-all.network /etc/systemd/networkd.conf.d/nodeagent.conf
