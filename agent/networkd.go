package agent

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// NetworkdPaths says where to look for systemd-networkd; tests point it at a
// temporary tree.
type NetworkdPaths struct {
	// Proc is scanned for a running systemd-networkd.
	Proc string
	// Conf and ConfDirs are networkd.conf and its drop-in directories, in
	// the order systemd reads them.
	Conf     string
	ConfDirs []string
}

// DefaultNetworkdPaths returns systemd's own paths.
func DefaultNetworkdPaths() NetworkdPaths {
	return NetworkdPaths{
		Proc:     "/proc",
		Conf:     "/etc/systemd/networkd.conf",
		ConfDirs: []string{"/usr/lib/systemd/networkd.conf.d", "/run/systemd/networkd.conf.d", "/etc/systemd/networkd.conf.d"},
	}
}

// NetworkdConflicts returns a warning for each setting of a running
// systemd-networkd that would delete nodeagent's routing: with
// ManageForeignRoutingPolicyRules and ManageForeignRoutes at their default
// (yes), networkd removes rules and routes it did not configure whenever it
// reconfigures, nodeagent's included.
func NetworkdConflicts(p NetworkdPaths) []string {
	if !networkdRunning(p.Proc) {
		return nil
	}
	settings := map[string]string{}
	files := []string{p.Conf}
	for _, dir := range p.ConfDirs {
		m, _ := filepath.Glob(filepath.Join(dir, "*.conf"))
		sort.Strings(m)
		files = append(files, m...)
	}
	for _, f := range files {
		readNetworkSection(f, settings)
	}
	var warnings []string
	for _, key := range []string{"ManageForeignRoutingPolicyRules", "ManageForeignRoutes"} {
		if v, ok := settings[key]; !ok || isTrue(v) {
			warnings = append(warnings, "systemd-networkd runs with "+key+"=yes, which deletes routing that networkd did not configure, nodeagent's included; set "+key+"=no in a networkd.conf.d drop-in")
		}
	}
	return warnings
}

func readNetworkSection(path string, into map[string]string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.Trim(line, "[]")
		case section == "Network":
			if k, v, ok := strings.Cut(line, "="); ok {
				into[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
	}
}

func isTrue(v string) bool {
	switch strings.ToLower(v) {
	case "1", "yes", "true", "on":
		return true
	}
	return false
}

// networkdRunning reports whether a systemd-networkd process exists (its
// state directory outlives it, so that is no sign).
func networkdRunning(proc string) bool {
	comms, _ := filepath.Glob(filepath.Join(proc, "[0-9]*", "comm"))
	for _, c := range comms {
		// comm is truncated to 15 bytes: "systemd-network".
		if b, err := os.ReadFile(c); err == nil && strings.TrimSpace(string(b)) == "systemd-network" {
			return true
		}
	}
	return false
}
