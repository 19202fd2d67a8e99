package importer

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// A PIA tunnel made by PIA's own scripts (pia-foss/manual-connections) is
// not a WireGuard device nodeagent can adopt: the scripts register an
// ephemeral key of theirs with PIA and keep the forwarded port bound from
// a loop of their own. It becomes a `pia:` device of nodeagent's (its own
// key and registration), and the switch-over stops the scripts first,
// with the VLAN's kill switch closed through the gap.
//
// What the scripts leave, from their source (connect_to_wireguard_with_
// token.sh, port_forwarding.sh, get_token.sh, get_region.sh):
//   - /etc/wireguard/pia.conf (PIA_CONF_PATH's default), brought up with
//     `wg-quick up pia`: an Address without a prefix length (peer_ip), the
//     PrivateKey, and one [Peer] with PersistentKeepalive = 25, the
//     server's key, AllowedIPs = 0.0.0.0/0 and Endpoint = WG_SERVER_IP:
//     server_port (1337): wg-quick's full tunnel (fwmark, table 51820,
//     rules, its nft table);
//   - port_forwarding.sh, run by connect_to_wireguard_with_token.sh with
//     PIA_PF=true, in the foreground of the scripts that started it: a
//     bash loop that binds the port every 15 minutes (sleep 900), with
//     PIA_TOKEN, PF_GATEWAY and PF_HOSTNAME in its environment and what
//     the operator gave run_setup.sh (PREFERRED_REGION, PIA_USER,
//     PIA_PASS) inherited;
//   - /opt/piavpn-manual: token (get_token.sh: the token and its expiry),
//     latencyList (get_region.sh), dipAddress (get_dip.sh).

// PIAScripts is what PIA's manual-connections scripts left on the node.
type PIAScripts struct {
	// Processes are the scripts running now (port_forwarding.sh's loop,
	// the scripts waiting on it).
	Processes []PIAProcess `json:"processes,omitempty"`
	// Files are the names in /opt/piavpn-manual.
	Files []string `json:"files,omitempty"`
	// Units are the systemd services under /etc/systemd/system that run
	// the scripts.
	Units []string `json:"units,omitempty"`
	// Region is the region id the operator asked for (PREFERRED_REGION),
	// "" when none was found.
	Region string `json:"region,omitempty"`
	// Hostname is the WireGuard server's name (PF_HOSTNAME).
	Hostname string `json:"hostname,omitempty"`
	// PortForward says the port-forwarding loop runs (or PIA_PF=true).
	PortForward bool `json:"portForward,omitempty"`
	// Username and Password are the account (PIA_USER, PIA_PASS) where a
	// process's environment or a unit's gives them: written to the
	// credentials file (0600) and nowhere else.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// PIAProcess is one of the scripts, running.
type PIAProcess struct {
	PID    int    `json:"pid"`
	Script string `json:"script"`
	// Dir is its working directory (where the scripts and ca.rsa.4096.crt
	// are).
	Dir string `json:"dir,omitempty"`
	// Unit is the systemd unit it runs in, "" for none (a shell).
	Unit string `json:"unit,omitempty"`
}

// piaScripts are the manual-connections scripts, by file name.
var piaScripts = []string{"port_forwarding.sh", "connect_to_wireguard_with_token.sh", "run_setup.sh", "get_region.sh", "get_token.sh"}

// piaEnv are the environment variables read from the scripts' processes
// and units.
var piaEnv = []string{"PREFERRED_REGION", "PF_HOSTNAME", "WG_HOSTNAME", "PIA_PF", "PIA_USER", "PIA_PASS"}

// maxProcFile bounds what is read of one /proc file.
const maxProcFile = 64 << 10

// readProcFile reads a /proc file with a cap (they report no size).
func readProcFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxProcFile))
}

// readPIA finds the scripts' processes under proc and their files under
// opt. A process's environment is root's to read: without root it is
// said in Problems.
func readPIA(proc, opt string, s *Snapshot) {
	var p PIAScripts
	env := map[string]string{}
	ents, err := os.ReadDir(proc)
	if err != nil {
		s.Problems = append(s.Problems, fmt.Sprintf("%s: cannot list: %v", proc, err))
	}
	for i, e := range ents {
		if i > 1<<20 {
			break
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join(proc, e.Name())
		cmd, err := readProcFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue
		}
		script := ""
		for _, a := range bytes.Split(cmd, []byte{0}) {
			if b := filepath.Base(string(a)); slices.Contains(piaScripts, b) {
				script = b
				break
			}
		}
		if script == "" {
			continue
		}
		pp := PIAProcess{PID: pid, Script: script}
		if d, err := os.Readlink(filepath.Join(dir, "cwd")); err == nil {
			pp.Dir = d
		}
		if cg, err := readProcFile(filepath.Join(dir, "cgroup")); err == nil {
			pp.Unit = unitOfCgroup(string(cg))
		}
		b, err := readProcFile(filepath.Join(dir, "environ"))
		if err != nil {
			s.Problems = append(s.Problems, fmt.Sprintf("PIA's %s (pid %d): its environment cannot be read (run nodeagent import as root): the region and the account are not known", script, pid))
		}
		for _, kv := range bytes.Split(b, []byte{0}) {
			k, v, ok := strings.Cut(string(kv), "=")
			if ok && slices.Contains(piaEnv, k) && v != "" && env[k] == "" {
				env[k] = v
			}
		}
		if script == "port_forwarding.sh" {
			p.PortForward = true
		}
		p.Processes = append(p.Processes, pp)
	}
	slices.SortFunc(p.Processes, func(a, b PIAProcess) int { return a.PID - b.PID })
	if names, err := os.ReadDir(filepath.Join(opt, "piavpn-manual")); err == nil {
		for _, n := range names {
			p.Files = append(p.Files, n.Name())
		}
	}
	p.setEnv(env)
	if len(p.Processes)+len(p.Files) > 0 || p.Region != "" {
		if s.PIA == nil {
			s.PIA = &PIAScripts{}
		}
		s.PIA.merge(p)
	}
}

// setEnv takes what the scripts' environment says.
func (p *PIAScripts) setEnv(env map[string]string) {
	p.Region = cmpOr(p.Region, env["PREFERRED_REGION"])
	p.Hostname = cmpOr(p.Hostname, env["PF_HOSTNAME"], env["WG_HOSTNAME"])
	p.PortForward = p.PortForward || env["PIA_PF"] == "true"
	p.Username = cmpOr(p.Username, env["PIA_USER"])
	p.Password = cmpOr(p.Password, env["PIA_PASS"])
}

// merge adds what q found to p.
func (p *PIAScripts) merge(q PIAScripts) {
	p.Processes = append(p.Processes, q.Processes...)
	p.Files = append(p.Files, q.Files...)
	p.Units = append(p.Units, q.Units...)
	p.Region = cmpOr(p.Region, q.Region)
	p.Hostname = cmpOr(p.Hostname, q.Hostname)
	p.PortForward = p.PortForward || q.PortForward
	p.Username = cmpOr(p.Username, q.Username)
	p.Password = cmpOr(p.Password, q.Password)
}

func cmpOr(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// unitOfCgroup is the systemd service a process runs in, from its
// /proc/PID/cgroup ("0::/system.slice/pia.service"), "" for none.
func unitOfCgroup(cg string) string {
	for line := range strings.SplitSeq(cg, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for part := range strings.SplitSeq(f[2], "/") {
			if strings.HasSuffix(part, ".service") && !strings.HasPrefix(part, "user@") {
				return part
			}
		}
	}
	return ""
}

// isPIAFile reports whether a wg-quick file has the shape
// connect_to_wireguard_with_token.sh writes: one peer, AllowedIPs
// 0.0.0.0/0, PersistentKeepalive 25, an endpoint on port 1337, and
// addresses without a prefix length.
func isPIAFile(w WGQuickFile) bool {
	if len(w.Peers) != 1 || len(w.Addresses) == 0 {
		return false
	}
	p := w.Peers[0]
	if !slices.Equal(p.AllowedIPs, []string{"0.0.0.0/0"}) || p.PersistentKeepalive != 25 || !strings.HasSuffix(p.Endpoint, ":1337") {
		return false
	}
	for _, a := range w.Addresses {
		if strings.Contains(a, "/") {
			return false
		}
	}
	return true
}

// piaDevice is the wg-quick device PIA's scripts made, "" for none: the
// file named pia (the scripts' PIA_CONF_PATH) of their shape, or another
// of their shape while their processes or files are there.
func (b *builder) piaDevice() string {
	var shaped []string
	for _, w := range b.s.WGQuick {
		if isPIAFile(w) {
			shaped = append(shaped, w.Name)
		}
	}
	if slices.Contains(shaped, "pia") {
		return "pia"
	}
	if len(shaped) == 1 && b.s.PIA != nil {
		return shaped[0]
	}
	return ""
}

// piaMark is the fwmark of the PIA scripts' device (wg-quick's full
// tunnel's table and rules use it), 0 for none.
func (b *builder) piaMark() int {
	for _, d := range b.s.WireGuard {
		if d.Name == b.pia {
			return d.FwMark
		}
	}
	return 0
}

// piaEntry is the wireguard entry that replaces the scripts' tunnel: a
// pia: device of nodeagent's, and the credentials file it reads.
func (b *builder) piaEntry(name string) []string {
	p := b.s.PIA
	if p == nil {
		p = &PIAScripts{}
	}
	cred := path.Join(b.o.Root, "pia.cred")
	lines := []string{"- name: " + scalar(name),
		fmt.Sprintf("  # PIA's manual-connections scripts made this tunnel: /etc/wireguard/%s.conf (written by", name),
		"  # connect_to_wireguard_with_token.sh with an ephemeral key, brought up by wg-quick)."}
	if l := piaLoop(p); l != "" {
		lines = append(lines, "  # "+l+".")
	}
	lines = append(lines,
		"  # It is not adopted: nodeagent is a PIA client of its own (its own key, registration and",
		"  # forwarded port) once the switch-over's steps have stopped the scripts. The forwarded port",
		"  # will change. The device keeps its name, so firewall rules that name it still match.",
		"  pia:")
	switch {
	case p.Region != "":
		lines = append(lines, "    # the region the scripts were given (PREFERRED_REGION)",
			"    region: "+scalar(p.Region))
	default:
		srv := ""
		if p.Hostname != "" {
			srv = " (the scripts' server was " + p.Hostname + ")"
		}
		lines = append(lines, "    # the scripts' region was not found"+srv+": auto picks the nearest; write its id to keep it",
			"    region: auto")
	}
	lines = append(lines, "    credentialsFile: "+scalar(cred))
	if p.PortForward {
		lines = append(lines, "    # port_forwarding.sh kept a port bound: nodeagent keeps one of its own bound; set",
			"    # onChange to deliver it where the scripts' port went",
			"    portForward: true")
	}
	if p.Username != "" && p.Password != "" {
		b.files = append(b.files, File{Path: "pia.cred", Data: []byte(p.Username + "\n" + p.Password + "\n"), Mode: 0o600})
	} else {
		b.notes = append(b.notes, fmt.Sprintf("%s: the PIA account was not found (PIA_USER and PIA_PASS in the scripts' environment or unit): write it to %s (two lines, username then password; chmod 600) before nodeagent validate", name, cred))
		b.piaCredStep = fmt.Sprintf("printf '%%s\\n%%s\\n' USERNAME PASSWORD > %s && chmod 600 %s   # your PIA account (the scripts' was not found)", cred, cred)
	}
	return lines
}

// piaLoop says what of the scripts runs now, for the entry's comment.
func piaLoop(p *PIAScripts) string {
	for _, pr := range p.Processes {
		if pr.Script == "port_forwarding.sh" {
			return fmt.Sprintf("port_forwarding.sh (pid %d) binds the forwarded port every 15 minutes", pr.PID)
		}
	}
	return ""
}

// piaSteps are the switch-over's steps off PIA's scripts, after nodeagent
// has started with the VLAN's kill switch closed to all but the tunnel:
// the scripts stop, their tunnel goes, nodeagent makes its own.
func (b *builder) piaSteps() []string {
	p := b.s.PIA
	if p == nil {
		p = &PIAScripts{}
	}
	var st []string
	if slices.Contains(b.s.WGQuickUnits, b.pia) {
		st = append(st, fmt.Sprintf("systemctl disable wg-quick@%s   # not at the next boot", b.pia))
	}
	for _, u := range p.Units {
		st = append(st, fmt.Sprintf("systemctl disable --now %s   # it runs PIA's scripts: stopped first, and not at the next boot", u))
	}
	var pids []string
	for _, pr := range p.Processes {
		if pr.Unit == "" || !slices.Contains(p.Units, pr.Unit) {
			pids = append(pids, strconv.Itoa(pr.PID))
		}
	}
	if len(pids) > 0 {
		st = append(st, fmt.Sprintf("kill %s   # PIA's scripts as import found them: %s (ps -o pid,args -p %s shows they still are)", strings.Join(pids, " "), piaProcs(p), strings.Join(pids, ",")))
	}
	st = append(st,
		fmt.Sprintf("wg-quick down %s   # the scripts' tunnel goes; the VLAN's kill switch holds its traffic until nodeagent's %s is up", b.pia, b.pia),
		fmt.Sprintf("systemctl reload nodeagent   # nodeagent makes its own %s now: its own key and registration", b.pia),
		"nodeagentctl wait --for=condition/TunnelHealthy --timeout=3m",
		"nodeagentctl status   # the forwarded port is a new one: whatever took the scripts' port must take it (portForward.onChange)",
	)
	if len(p.Files) > 0 {
		st = append(st, "rm -r /opt/piavpn-manual   # the scripts' files ("+strings.Join(p.Files, ", ")+"); nodeagent keeps its own under /var/lib/nodeagent")
	}
	return st
}

func piaProcs(p *PIAScripts) string {
	var out []string
	for _, pr := range p.Processes {
		out = append(out, fmt.Sprintf("%s (pid %d)", pr.Script, pr.PID))
	}
	return strings.Join(out, ", ")
}
