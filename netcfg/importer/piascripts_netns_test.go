package importer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestPIAScriptsTakeOver is the take-over of a PIA tunnel that PIA's own
// manual-connections scripts made (issue 40, item 6). The VLAN (a veth in
// the stub's lab) is routed into the scripts' tunnel the old way: a rule
// from its prefix into table 150, whose default goes through pia, and a
// masquerade out of pia. A host on the VLAN pings the stub's far side
// through it. nodeagent import reads the node; the test follows the steps
// it prints: install the files, start nodeagent (its kill switch closes
// the VLAN to all but pia), stop the scripts, wg-quick down pia, reload.
// Then the VLAN's traffic reaches the far side through nodeagent's own
// tunnel; not one VLAN packet reached the WAN outside a tunnel in the
// meantime (counted there); the scripts' loop is gone; the port is
// forwarded again (a new one) and delivered by onChange.
//
// With NODEAGENT_PIA_SCRIPTS naming a checkout of pia-foss/manual-
// connections (fetched, never committed) the old setup is made by the
// scripts themselves, unmodified, run as their README says (run_setup.sh
// with PIA_USER, PIA_PASS, PIA_PF=true, PREFERRED_REGION,
// VPN_PROTOCOL=wireguard); only the copy's ca.rsa.4096.crt is the stub's
// "PIA root", and the stub's names resolve to it. Without it, a stand-in
// leaves the state the scripts leave, derived from their source (see
// pia.go): their pia.conf to the byte, wg-quick up pia, a port bound, and
// the process chain run_setup.sh, get_region.sh,
// connect_to_wireguard_with_token.sh, port_forwarding.sh sleeping in its
// loop, with the scripts' environment.
func TestPIAScriptsTakeOver(t *testing.T) {
	testenv.RequireRoot(t)
	if testenv.InVM() {
		t.Skip("the host tier runs this: it needs bash, curl and wg-quick, which the VM tier's initramfs lacks")
	}
	scripts := os.Getenv("NODEAGENT_PIA_SCRIPTS")
	tools := []string{"bash", "curl", "wg-quick", "wg", "nft", "ping"}
	if scripts != "" {
		tools = append(tools, "jq")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is missing (testenv/deps.sh installs it): %v", tool, err)
		}
	}
	if _, err := os.Stat("/etc/wireguard"); err != nil {
		t.Skipf("/etc/wireguard (wireguard-tools) is missing: ip netns exec binds the scripts' own over it: %v", err)
	}
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	node := l.Node

	// The scripts' world in the node: `ip netns exec` binds
	// /etc/netns/NAME/* over /etc (their hosts, their /etc/wireguard),
	// and /opt is a directory of the test's.
	nsEtc := filepath.Join("/etc/netns", node.Name)
	if err := os.MkdirAll(filepath.Join(nsEtc, "wireguard"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(nsEtc) })
	hosts := fmt.Sprintf("127.0.0.1 localhost\n%s www.privateinternetaccess.com serverlist.piaservers.net\n", piastub.WWW)
	if err := os.WriteFile(filepath.Join(nsEtc, "hosts"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	opt := t.TempDir()
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	if !testenv.HasModule("wireguard") {
		path = wireguardGo(t) + ":" + path
	}
	env := []string{"PATH=" + path, "HOME=/root", "LC_ALL=C.UTF-8", "CURL_CA_BUNDLE=" + l.Files.WebCAFile}
	inNode := func(dir string, env []string, args ...string) *exec.Cmd {
		c := exec.Command("ip", append([]string{"netns", "exec", node.Name, "sh", "-c", `mount --bind "$0" /opt && cd "$1" && shift && exec "$@"`, opt, dir}, args...)...)
		c.Env = env
		return c
	}
	var procs []*exec.Cmd
	t.Cleanup(func() {
		for _, c := range procs {
			if c.Process != nil {
				killTree(c.Process.Pid)
				c.Wait()
			}
		}
		inNode("/", env, "wg-quick", "down", "pia").Run()
	})

	// The operator's part of the old setup: the VLAN's rule into table
	// 150 and forwarding (the route and the masquerade once pia is up).
	run := func(args ...string) {
		t.Helper()
		node.Exec(t, args...)
	}
	run("sysctl", "-qw", "net.ipv4.ip_forward=1")
	run("ip", "rule", "add", "from", "10.10.50.0/24", "lookup", "150", "pref", "1000")

	user, pass := "p1234567", "hunter2-stub" // the stub's account (piastub.Options defaults)
	// A file, not a pipe: what the scripts start (wireguard-go, sleep)
	// holds their output open long after they end.
	outFile, err := os.Create(filepath.Join(t.TempDir(), "scripts.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	scriptsOut := fileText(outFile.Name())
	var boundPort int
	if scripts != "" {
		dir := t.TempDir()
		copyDir(t, scripts, dir)
		// The scripts check the servers' certificates against the root in
		// their directory: the stub's stands in for PIA's.
		ca, err := os.ReadFile(l.Files.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "ca.rsa.4096.crt"), ca, 0o644)
		senv := append(slices.Clone(env), "PIA_USER="+user, "PIA_PASS="+pass, "PIA_PF=true", "PIA_DNS=false", "DISABLE_IPV6=no",
			"AUTOCONNECT=false", "PREFERRED_REGION=stub_ams", "VPN_PROTOCOL=wireguard", "DIP_TOKEN=no")
		c := inNode(dir, senv, "./run_setup.sh")
		c.Stdout, c.Stderr = outFile, outFile
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, c)
		re := regexp.MustCompile(`Forwarded port\s+(?:\x1b\[[0-9;]*m)?(\d+)`)
		waitUntil(t, "PIA's scripts to bind a port", 120*time.Second, func() bool {
			m := re.FindStringSubmatch(scriptsOut())
			if m != nil {
				boundPort, _ = strconv.Atoi(m[1])
			}
			return m != nil
		}, scriptsOut)
	} else {
		boundPort = standIn(t, l, env, inNode, user, pass, &procs)
	}
	t.Logf("the scripts' tunnel is up, port %d bound", boundPort)
	run("ip", "route", "add", "default", "dev", "pia", "table", "150")
	run("nft", "add", "table", "ip", "oldnat")
	run("nft", "add", "chain", "ip", "oldnat", "post", "{ type nat hook postrouting priority 100 ; }")
	run("nft", "add", "rule", "ip", "oldnat", "post", "ip", "saddr", "10.10.50.0/24", "oifname", "pia", "masquerade")
	waitUntil(t, "the VLAN host to reach the far side through the scripts' tunnel", 30*time.Second, l.PingFar, nil)
	exit0, _ := l.FarSaw(t)

	// nodeagent import.
	s, err := Read(context.Background(), node.Host, ReadOptions{Etc: nsEtc, Opt: opt})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "etc-nodeagent")
	out := filepath.Join(t.TempDir(), "import")
	r, err := Build(s, Options{Root: root, Out: out})
	if err != nil {
		t.Fatalf("%v\n%s", err, r.Config)
	}
	t.Logf("imported config:\n%s", r.Config)
	t.Logf("steps:\n  %s\nnotes:\n  %s", strings.Join(r.Steps, "\n  "), strings.Join(r.Notes, "\n  "))
	if s.PIA == nil || len(s.PIA.Processes) == 0 {
		t.Fatalf("the scripts were not found: %+v", s.PIA)
	}
	for _, want := range []string{"- name: pia\n", "region: stub_ams\n", "portForward: true\n", "killSwitch: true\n", "- {from: 10.10.50.0/24, allowOut: [pia]}"} {
		if !strings.Contains(string(r.Config), want) {
			t.Errorf("the config lacks %q", want)
		}
	}
	var pids []int
	for _, p := range s.PIA.Processes {
		pids = append(pids, p.PID)
	}
	if !slices.ContainsFunc(r.Steps, func(st string) bool { return strings.HasPrefix(st, "kill ") }) ||
		!slices.Contains(r.Steps, "wg-quick down pia   # the scripts' tunnel goes; the VLAN's kill switch holds its traffic until nodeagent's pia is up") {
		t.Errorf("the steps do not stop the scripts and their tunnel")
	}
	for _, secret := range []string{pass} {
		if strings.Contains(string(r.Config), secret) || strings.Contains(strings.Join(append(r.Steps, r.Notes...), "\n"), secret) {
			t.Errorf("the account's password is in the config or the printed steps")
		}
	}
	if err := WriteOut(out, r); err != nil {
		t.Fatal(err)
	}

	// Step: install. The stub's URLs and roots are the test's addition
	// (a real node uses PIA's, the defaults), and onChange delivers the
	// port to a file.
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	copyDir(t, out, root)
	delivered := filepath.Join(t.TempDir(), "port")
	cfgPath := filepath.Join(root, ConfigName)
	b, _ := os.ReadFile(cfgPath)
	cred := "credentialsFile: " + filepath.Join(root, "pia.cred") + "\n"
	stub := fmt.Sprintf("%s      serverList: %s\n      tokenURL: %s\n      caFile: %s\n      serverListKeyFile: %s\n      webCAFile: %s\n",
		cred, l.Files.ServerList, l.Files.TokenURL, l.Files.CAFile, l.Files.ServerListKeyFile, l.Files.WebCAFile)
	patched := strings.Replace(string(b), cred, stub, 1)
	patched = strings.Replace(patched, "portForward: true\n",
		fmt.Sprintf("portForward: {enabled: true, onChange: [/bin/sh, -c, 'echo $NODEAGENT_PIA_PORT > %s']}\n", delivered), 1)
	if err := os.WriteFile(cfgPath, []byte(patched), 0o644); err != nil {
		t.Fatal(err)
	}
	// Step: validate.
	if _, err := config.Load(cfgPath); err != nil {
		t.Fatalf("the installed config does not validate:\n%v\n%s", err, patched)
	}

	// A ping from the VLAN host every 50 ms from here to the end.
	ping := exec.Command("ip", "netns", "exec", l.LAN.Name, "ping", "-n", "-i", "0.05", "-W", "1", piastub.Far.String())
	pingOut := &testenv.SyncBuffer{}
	ping.Stdout, ping.Stderr = pingOut, pingOut // ping starts nothing that outlives it
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	procs = append(procs, ping)

	// Step: systemctl enable --now nodeagent.
	d, stop := runDaemon(t, node, cfgPath, filepath.Join(root, "state"))
	defer stop()
	waitUntil(t, "nodeagent's kill switch", 60*time.Second, func() bool { return condition(d.Status(), api.CondKillSwitchArmed) }, func() string { return statusJSON(d) })
	t.Logf("nodeagent runs beside the scripts' tunnel; its plan:\n%s", planText(d))

	// Steps: stop the scripts; wg-quick down pia; reload.
	// What the scripts started (port_forwarding.sh's sleep) outlives
	// them, reparented: ended with the test.
	var orphans []int
	for _, p := range pids {
		orphans = append(orphans, descendants(p)...)
	}
	t.Cleanup(func() {
		for _, p := range orphans {
			syscall.Kill(p, syscall.SIGKILL)
		}
	})
	switched := time.Now()
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGTERM)
	}
	waitUntil(t, "the scripts to end", 10*time.Second, func() bool {
		return !slices.ContainsFunc(pids, alive)
	}, nil)
	if o, err := inNode("/", env, "wg-quick", "down", "pia").CombinedOutput(); err != nil {
		t.Fatalf("wg-quick down pia: %v\n%s", err, o)
	}
	if rl := d.Reload(context.Background()); len(rl.Errors) > 0 {
		t.Fatalf("reload: %q", rl.Errors)
	}
	waitUntil(t, "nodeagent's own tunnel to be healthy", 120*time.Second, func() bool { return condition(d.Status(), api.CondTunnelHealthy) }, func() string { return statusJSON(d) })
	waitUntil(t, "the VLAN host to reach the far side through nodeagent's tunnel", 30*time.Second, l.PingFar, nil)
	gap := time.Since(switched)
	waitUntil(t, "the port delivered", 60*time.Second, func() bool {
		b, err := os.ReadFile(delivered)
		return err == nil && strings.TrimSpace(string(b)) != "" && strings.TrimSpace(string(b)) != "0"
	}, func() string { return statusJSON(d) })
	time.Sleep(time.Second)
	ping.Process.Signal(syscall.SIGINT)
	ping.Wait()

	st := d.Status()
	var tun api.PIATunnel
	for _, p := range st.PIA {
		if p.Device == "pia" {
			tun = p
		}
	}
	port, _ := os.ReadFile(delivered)
	v4, v6, plain := l.Leaks(t)
	exit1, other := l.FarSaw(t)
	sent, received := pingCounts(pingOut.String())
	t.Logf("switch-over: %.1fs from stopping the scripts to nodeagent's tunnel carrying the VLAN; VLAN pings %d sent, %d received (%d lost in the gap); VLAN packets at the WAN outside a tunnel: v4 %d, v6 %d, plaintext %d; far side saw %d more from the stub's exit, %d from elsewhere; the scripts' port %d, nodeagent's %d (delivered %q)",
		gap.Seconds(), sent, received, sent-received, v4, v6, plain, exit1-exit0, other, boundPort, tun.ForwardedPort, strings.TrimSpace(string(port)))
	if v4+v6+plain != 0 {
		t.Errorf("VLAN packets reached the WAN outside a tunnel during the switch: v4 %d, v6 %d, plaintext %d", v4, v6, plain)
	}
	if exit1 <= exit0 || other != 0 {
		t.Errorf("the far side saw %d new packets from the stub's exit and %d from elsewhere", exit1-exit0, other)
	}
	if tun.ForwardedPort == 0 || strings.TrimSpace(string(port)) != strconv.Itoa(tun.ForwardedPort) {
		t.Errorf("the port is not forwarded and delivered: status %d, delivered %q", tun.ForwardedPort, port)
	}
	for _, p := range pids {
		if alive(p) {
			t.Errorf("the scripts' process %d still runs", p)
		}
	}
	if alias, _ := node.TryExec("cat", "/sys/class/net/pia/ifalias"); strings.TrimSpace(alias) != "nodeagent" {
		t.Errorf("pia is not nodeagent's: ifalias %q", alias)
	}
	if t.Failed() {
		t.Logf("the scripts' output:\n%s", scriptsOut())
	}
}

// standIn leaves the state PIA's scripts leave (pia.go has it from their
// source) and returns the port it bound: a token, the list, addKey for a
// key of its own, /etc/wireguard/pia.conf as connect_to_wireguard_with_
// token.sh writes it, wg-quick up pia, a signature and a bind; then the
// process chain, ending in port_forwarding.sh's loop, with their
// environment. The HTTP is curl's, as theirs is.
func standIn(t *testing.T, l *piastub.Lab, env []string, inNode func(string, []string, ...string) *exec.Cmd, user, pass string, procs *[]*exec.Cmd) int {
	t.Helper()
	curl := func(args ...string) map[string]any {
		t.Helper()
		o, err := inNode("/", env, append([]string{"curl", "-s", "-m", "10"}, args...)...).Output()
		if err != nil {
			t.Fatalf("curl %q: %v\n%s", args, err, o)
		}
		line, _, _ := bytes.Cut(o, []byte("\n")) // the list's JSON is its first line
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("curl %q: %v\n%s", args, err, o)
		}
		return m
	}
	tok := curl("--request", "POST", "https://www.privateinternetaccess.com/api/client/v2/token", "--form", "username="+user, "--form", "password="+pass)["token"].(string)
	list := curl("https://serverlist.piaservers.net/vpninfo/servers/v6")
	var ip, cn string
	for _, r := range list["regions"].([]any) {
		rm := r.(map[string]any)
		if rm["id"] == "stub_ams" {
			wg := rm["servers"].(map[string]any)["wg"].([]any)[0].(map[string]any)
			ip, cn = wg["ip"].(string), wg["cn"].(string)
		}
	}
	key, _ := wgtypes.GeneratePrivateKey()
	ca := l.Files.CAFile
	reg := curl("-G", "--connect-to", cn+"::"+ip+":", "--cacert", ca, "--data-urlencode", "pt="+tok, "--data-urlencode", "pubkey="+key.PublicKey().String(), "https://"+cn+":1337/addKey")
	if reg["status"] != "OK" {
		t.Fatalf("addKey: %v", reg)
	}
	conf := fmt.Sprintf("\n[Interface]\nAddress = %s\nPrivateKey = %s\n\n[Peer]\nPersistentKeepalive = 25\nPublicKey = %s\nAllowedIPs = 0.0.0.0/0\nEndpoint = %s:%v\n\n",
		reg["peer_ip"], key, reg["server_key"], ip, reg["server_port"])
	if err := os.WriteFile(filepath.Join("/etc/netns", l.Node.Name, "wireguard", "pia.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := inNode("/", env, "wg-quick", "up", "pia").CombinedOutput(); err != nil {
		t.Fatalf("wg-quick up pia: %v\n%s", err, o)
	}
	sig := curl("-G", "--connect-to", cn+"::"+ip+":", "--cacert", ca, "--data-urlencode", "token="+tok, "https://"+cn+":19999/getSignature")
	bind := curl("-G", "--connect-to", cn+"::"+ip+":", "--cacert", ca, "--data-urlencode", "payload="+sig["payload"].(string), "--data-urlencode", "signature="+sig["signature"].(string), "https://"+cn+":19999/bindPort")
	if bind["status"] != "OK" {
		t.Fatalf("bindPort: %v", bind)
	}
	var payload struct {
		Port int `json:"port"`
	}
	b, _ := exec.Command("sh", "-c", `printf %s "$0" | base64 -d`, sig["payload"].(string)).Output()
	json.Unmarshal(b, &payload)
	// The chain: each script runs the next in the foreground, as theirs
	// do; port_forwarding.sh sleeps 900 s between binds.
	dir := t.TempDir()
	next := map[string]string{"run_setup.sh": "./get_region.sh", "get_region.sh": "./connect_to_wireguard_with_token.sh",
		"connect_to_wireguard_with_token.sh": "./port_forwarding.sh", "port_forwarding.sh": "while true; do sleep 900; done"}
	for name, body := range next {
		os.WriteFile(filepath.Join(dir, name), []byte("#!/usr/bin/env bash\n"+body+"\n"), 0o755)
	}
	senv := append(slices.Clone(env), "PIA_USER="+user, "PIA_PASS="+pass, "PIA_PF=true", "PIA_DNS=false", "PREFERRED_REGION=stub_ams",
		"VPN_PROTOCOL=wireguard", "PIA_TOKEN="+tok, "WG_SERVER_IP="+ip, "WG_HOSTNAME="+cn, "PF_GATEWAY="+ip, "PF_HOSTNAME="+cn)
	// get_region.sh makes /opt/piavpn-manual and an empty latencyList
	// (it writes to it only when it measures), removed once connect
	// returns, which it does not while the loop runs.
	c := inNode(dir, senv, "sh", "-c", "mkdir -p /opt/piavpn-manual && touch /opt/piavpn-manual/latencyList && exec ./run_setup.sh")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	*procs = append(*procs, c)
	waitUntil(t, "the stand-in's port_forwarding.sh", 10*time.Second, func() bool {
		o, _ := exec.Command("pgrep", "-f", "port_forwarding.sh").Output()
		return len(o) > 0
	}, nil)
	return payload.Port
}

// wireguardGo builds wireguard-go (the module's own command) for wg-quick,
// which falls back to it where the kernel has no WireGuard, and returns
// its directory.
func wireguardGo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	c := exec.Command("go", "build", "-o", filepath.Join(dir, "wireguard-go"), "golang.zx2c4.com/wireguard")
	c.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := c.CombinedOutput(); err != nil {
		t.Fatalf("build wireguard-go: %v\n%s", err, o)
	}
	return dir
}

// runDaemon runs nodeagent on cfg in ns (as systemctl start would) until
// stop.
func runDaemon(t *testing.T, ns *testenv.NetNS, cfg, state string) (*agent.Daemon, func()) {
	t.Helper()
	dir := t.TempDir()
	logs := &testenv.SyncBuffer{}
	d, err := agent.NewDaemon(agent.RunOptions{
		Options: agent.Options{Config: cfg, TablesFile: filepath.Join(dir, "rt_tables.conf"), StateDir: state, PortDir: filepath.Join(dir, "ports")},
		Socket:  filepath.Join(dir, "nodeagent.sock"), SocketGroup: "nogroup", Host: ns.Host, Version: "test",
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("daemon: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Error("the daemon did not stop")
			}
			if t.Failed() {
				t.Logf("daemon log:\n%s", logs.String())
			}
		})
	}
	t.Cleanup(stop)
	return d, stop
}

func condition(s api.Status, typ string) bool {
	for _, c := range s.Conditions {
		if c.Type == typ {
			return c.Status == api.True
		}
	}
	return false
}

func statusJSON(d *agent.Daemon) string {
	b, _ := json.MarshalIndent(d.Status(), "", "  ")
	return string(b)
}

func planText(d *agent.Daemon) string {
	b, _ := json.MarshalIndent(d.Plan(context.Background()), "", "  ")
	return string(b)
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool, show func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			if show != nil {
				msg = "\n" + show()
			}
			t.Fatalf("timed out after %s waiting for %s%s", d, what, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) (packets )?received`)

func pingCounts(out string) (sent, received int) {
	m := pingSummary.FindStringSubmatch(out)
	if m == nil {
		return 0, 0
	}
	sent, _ = strconv.Atoi(m[1])
	received, _ = strconv.Atoi(m[2])
	return sent, received
}

// fileText returns a func reading the file at path.
func fileText(path string) func() string {
	return func() string {
		b, _ := os.ReadFile(path)
		return string(b)
	}
}

// alive reports whether process pid runs (a zombie, ended but not yet
// reaped by its parent, does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && len(b) > i+2 && b[i+2] != 'Z'
}

// descendants are the processes under pid.
func descendants(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 1 && f[1] == strconv.Itoa(pid) {
				out = append(out, child)
				out = append(out, descendants(child)...)
			}
		}
	}
	return out
}

// killTree kills pid and its descendants.
func killTree(pid int) {
	for _, p := range descendants(pid) {
		syscall.Kill(p, syscall.SIGKILL)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if o, err := exec.Command("cp", "-a", from+"/.", to+"/").CombinedOutput(); err != nil {
		t.Fatalf("cp %s: %v\n%s", from, err, o)
	}
}
