# --- udevlink: udev itself judges nodeagent's reading of .link files --------
# For each .link file below, installed alone beside Debian's 99-default.link,
# `udevadm test-builtin net_setup_link` on each of nodeagent's links says
# which file applies (ID_NET_LINK_FILE) and the name it gives
# (ID_NET_NAME); nodeagent's Coexistence condition must name exactly the
# files that would rename a link, or set its alias or address (udev 252's
# test-builtin applies Alias= and MACAddress= for real: nodeagent puts its
# mark back). Then a renaming .link stays installed and the VLAN is deleted:
# nodeagent makes it again, udev sees it appear, and `ip monitor link`
# counts the VLAN links made: a bounded number, never a loop.
begin udevlink
ul_links="$VLAN shim0 wg0"
check udevd-running systemctl is-active --quiet systemd-udevd
check ready wait_for 30 nodeagentctl status
ul_disagree=0 ul_rows=0
# ul_udev LINK FILE: what udev does to LINK with FILE installed: the file
# that applies, and "rename:NAME", "alias", "mac" for what it changes.
ul_udev() {
	local out file name eff=""
	out=$(udevadm test-builtin net_setup_link "/sys/class/net/$1" 2>/dev/null)
	file=$(sed -n 's/^ID_NET_LINK_FILE=//p' <<< "$out")
	name=$(sed -n 's/^ID_NET_NAME=//p' <<< "$out")
	[[ -n $name && $name != "$1" ]] && eff+="rename:$name "
	if [[ $file == "$2" ]]; then
		# what its [Link] section sets
		awk '/^\[/ {link = ($0 == "[Link]")} link && /^Alias=./ {f=1} END {exit !f}' "$2" && eff+="alias "
		awk '/^\[/ {link = ($0 == "[Link]")} link && /^MACAddress=./ {f=1} END {exit !f}' "$2" && eff+="mac "
	fi
	echo "$file ${eff% }"
}
# ul_nodeagent LINK FILE: what nodeagent's condition says FILE does to LINK.
ul_nodeagent() {
	local msg eff=""
	msg=$(nodeagentctl status -o json | grep -A3 '"type": "Coexistence"' | grep '"message"' | tr ';' '\n' | grep -F "$2: its [Match]" | grep -F "catches nodeagent's link $1 and")
	[[ $msg =~ renames\ it\ to\ ([^ ]+) ]] && eff+="rename:${BASH_REMATCH[1]} "
	[[ $msg == *"sets its alias"* ]] && eff+="alias "
	[[ $msg == *"sets its address"* ]] && eff+="mac "
	echo "${eff% }"
}
ul_case() {
	local name=$1 file=/etc/systemd/network/$1.link l u na eff
	cat > "$file"
	udevadm control --reload
	sleep 1.5
	for l in $ul_links; do
		u=$(ul_udev "$l" "$file")
		eff=${u#* }; [[ $u == *" "* ]] || eff=""
		na=$(ul_nodeagent "$l" "$file")
		printf '    %-24s %-10s udev: %-56s nodeagent: %s\n' "$name" "$l" "${u:-?}" "${na:--}"
		ul_rows=$((ul_rows + 1))
		if [[ $eff != "$na" ]]; then
			ul_disagree=$((ul_disagree + 1))
			fail "$name-$l" "udev '$u', nodeagent '$na'"
		fi
	done
	rm -f "$file"
	udevadm control --reload
	# What test-builtin changed for real (an alias) is nodeagent's again.
	wait_for 10 sh -c "for l in $ul_links; do ip -d link show \$l | grep -q 'alias nodeagent' || exit 1; done" || fail "$name-marks-back"
}
mac=$(cat "/sys/class/net/$VLAN/address")
ul_case 10-rename-vlan <<LINK
[Match]
OriginalName=$VLAN
[Link]
Name=vlan50
LINK
ul_case 10-keep-vlan <<LINK
[Match]
OriginalName=$VLAN
[Link]
NamePolicy=keep
Name=vlan50
LINK
ul_case 10-rename-wireguard <<'LINK'
[Match]
Type=wireguard
[Link]
Name=wgx
LINK
ul_case 10-alias-macvlan <<'LINK'
[Match]
Kind=macvlan
[Link]
Alias=lab
LINK
ul_case 10-permanent-mac <<LINK
[Match]
PermanentMACAddress=$mac
[Link]
Name=wan9
LINK
ul_case 10-mac-of-the-parent <<LINK
[Match]
MACAddress=$mac
Kind=vlan
[Link]
NamePolicy=keep
Alias=tagged
LINK
ul_case 10-altname-not-original <<'LINK'
[Match]
OriginalName=trunk50
[Link]
Name=vlan50
LINK
echo "    $ul_rows verdicts, $ul_disagree disagreements"
check no-disagreement test "$ul_disagree" = 0

# A renaming .link installed, the VLAN deleted: nodeagent makes it again,
# udev sees it appear and tries the rename; nodeagent reports the file and
# makes a bounded number of links.
cat > /etc/systemd/network/10-rename-vlan.link <<LINK
[Match]
OriginalName=$VLAN
[Link]
Name=vlan50
LINK
udevadm control --reload
check rename-named wait_for 10 sh -c "nodeagentctl status -o json | grep -q '10-rename-vlan.link: its \\[Match\\] (OriginalName=$VLAN) catches nodeagent.s link $VLAN and renames it to vlan50'"
since=$(date '+%Y-%m-%d %H:%M:%S')
ip -o -d monitor link > /root/udevlink-monitor.log 2>&1 &
mon=$!
sleep 0.5
ip link del "$VLAN"
check vlan-back wait_for 20 sh -c "ip -4 addr show $VLAN | grep -q 10.10.50.1/24"
sleep 8
kill "$mon"; wait "$mon" 2>/dev/null
# links made: each time the VLAN (under either name) appears after it was
# deleted (nodeagent may make it again with the ifindex it had).
made=$(awk -v re="^[0-9]+: ($VLAN|vlan50)@$TRUNK:" -v dre="^Deleted [0-9]+: ($VLAN|vlan50)@" '
	$0 ~ dre {gone = 1; next}
	$0 ~ re && gone {made++; gone = 0}
	END {print made + 0}' /root/udevlink-monitor.log)
echo "    VLAN links made after the deletion: $made"
grep -E "($VLAN|vlan50)@" /root/udevlink-monitor.log | cut -c1-110 | sed 's/^/    monitor: /' | head -12
journalctl -u systemd-udevd --since "$since" --no-pager -o cat | grep -iE "rename|$VLAN|vlan50" | head -5 | sed 's/^/    udevd: /'
journalctl -u nodeagent --since "$since" --no-pager -o cat | grep -E "op=\"[-+~] link ($VLAN|vlan50)" | sed 's/^/    journal: /'
check bounded-creations test "$made" -le 2
check one-creation test "$made" = 1
check vlan-named-ours sh -c "ip -d link show $VLAN | grep -q 'alias nodeagent'"
rm -f /etc/systemd/network/10-rename-vlan.link
udevadm control --reload
check rename-hazard-gone wait_for 10 sh -c "! nodeagentctl status -o json | grep -q 10-rename-vlan.link"
check converged wait_for 20 owned_present
