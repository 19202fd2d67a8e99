package host

import (
	"bytes"
	"crypto/sha256"
	"net"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// machineID is the node's identity for derived addresses: systemd's
// machine id (stable across reboots), else D-Bus's copy, else the host
// name; read once.
var machineID = sync.OnceValue(func() []byte {
	for _, f := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if b, err := os.ReadFile(f); err == nil && len(bytes.TrimSpace(b)) > 0 {
			return bytes.TrimSpace(b)
		}
	}
	name, _ := os.Hostname()
	return []byte(name)
})

// netnsIno is the inode of the namespace h works in: the same for the
// node's own namespace on every boot (the kernel's init_net), different
// for each other namespace, so two namespaces of one machine on one wire
// (tests, containers) derive different addresses.
func (h *Host) netnsIno() uint64 {
	var st unix.Stat_t
	if h.ns.IsOpen() {
		if unix.Fstat(int(h.ns), &st) == nil {
			return st.Ino
		}
		return 0
	}
	if unix.Stat("/proc/thread-self/ns/net", &st) == nil {
		return st.Ino
	}
	return 0
}

// StableMAC is the hardware address nodeagent gives a link it creates
// without one configured: derived from the machine id, the network
// namespace and the link's name, so the same on every restart and
// re-create (neighbours' ARP caches and DHCP reservations survive), and
// set in the create message, so udev's MACAddressPolicy=persistent leaves
// it alone (it rewrites only random addresses). Locally administered,
// unicast.
func (h *Host) StableMAC(name string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("nodeagent link address\x00" + string(machineID()) + "\x00" + strconv.FormatUint(h.netnsIno(), 10) + "\x00" + name))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}
