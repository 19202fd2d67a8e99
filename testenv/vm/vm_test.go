package vm

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseKernelDepends(t *testing.T) {
	for _, tt := range []struct {
		in, pkg, version string
	}{
		{"linux-image-6.1.0-57-amd64 (= 6.1.192-3)", "linux-image-6.1.0-57-amd64", "6.1.192-3"},
		{"linux-image-6.1.0-57-amd64", "linux-image-6.1.0-57-amd64", ""},
		{"foo (>= 1), linux-image-6.12.1-amd64 | bar", "linux-image-6.12.1-amd64", ""},
	} {
		pkg, version, err := parseKernelDepends(tt.in)
		if err != nil || pkg != tt.pkg || version != tt.version {
			t.Errorf("parseKernelDepends(%q) = %q, %q, %v; want %q, %q", tt.in, pkg, version, err, tt.pkg, tt.version)
		}
	}
	if _, _, err := parseKernelDepends("initramfs-tools"); err == nil {
		t.Error("parseKernelDepends without linux-image: no error")
	}
}

func TestParseControl(t *testing.T) {
	out := "Package: linux-image-amd64\nVersion: 6.1.192-3\nDescription: x\n more\n\nPackage: other\nVersion: 1\n"
	f := parseControl([]byte(out))
	if f["Version"] != "6.1.192-3" || f["Package"] != "linux-image-amd64" {
		t.Errorf("parseControl = %v", f)
	}
}

func TestParseLdd(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n"
	got, err := parseLdd([]byte(out))
	want := []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("parseLdd = %q, %v; want %q", got, err, want)
	}
	if _, err := parseLdd([]byte("\tlibfoo.so.1 => not found\n")); err == nil {
		t.Error("parseLdd with a missing library: no error")
	}
}

func TestParseGoList(t *testing.T) {
	got, err := parseGoList([]byte("a/b\t/src/a/b\t1\t0\t/src/a\na/c\t/src/a/c\t0\t0\t/src/a\na/d\t/src/a/d\t0\t2\t\n"))
	if err != nil {
		t.Fatal(err)
	}
	var has []bool
	for _, p := range got {
		has = append(has, p.binary != "")
	}
	if !reflect.DeepEqual(has, []bool{true, false, true}) || got[0].dir != "/src/a/b" || got[0].moduleDir != "/src/a" {
		t.Errorf("parseGoList = %+v", got)
	}
}

func TestClosure(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("modules.dep", strings.Join([]string{
		"kernel/net/8021q/8021q.ko: kernel/net/802/garp.ko kernel/net/802/stp.ko kernel/net/llc/llc.ko",
		"kernel/net/802/garp.ko: kernel/net/802/stp.ko kernel/net/llc/llc.ko",
		"kernel/net/802/stp.ko: kernel/net/llc/llc.ko",
		"kernel/net/llc/llc.ko:",
		"kernel/lib/libcrc32c.ko:",
		"kernel/crypto/crc32c_generic.ko.xz:",
		"kernel/net/netfilter/nf_conntrack.ko: kernel/lib/libcrc32c.ko",
	}, "\n")+"\n")
	write("modules.builtin", "kernel/net/packet/af_packet.ko\n")
	write("modules.softdep", "# comment\nsoftdep libcrc32c pre: crc32c\n")
	write("modules.alias", "alias crypto-crc32c crc32c_generic\nalias crc32c crc32c_generic\n")

	idx, err := loadModuleIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	order, missing := idx.closure([]string{"8021q", "af_packet", "nf-conntrack", "nope", "stp"})
	want := []string{"llc", "stp", "garp", "8021q", "crc32c_generic", "libcrc32c", "nf_conntrack"}
	if !reflect.DeepEqual(order, want) {
		t.Errorf("order = %q, want %q", order, want)
	}
	if !reflect.DeepEqual(missing, []string{"nope"}) {
		t.Errorf("missing = %q, want [nope]", missing)
	}
}

func TestTestArgs(t *testing.T) {
	got := testArgs(&Config{Bench: ".", BenchTime: "100x", Timeout: "10m", Args: []string{"-x"}})
	want := []string{"-test.v=true", "-test.paniconexit0", "-test.run=^$", "-test.bench=.", "-test.benchtime=100x", "-test.timeout=10m", "-x"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("testArgs = %q, want %q", got, want)
	}
	got = testArgs(&Config{Run: "TestA", Bench: ".", Count: "2", Short: true})
	want = []string{"-test.v=true", "-test.paniconexit0", "-test.run=TestA", "-test.bench=.", "-test.count=2", "-test.short=true"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("testArgs = %q, want %q", got, want)
	}
}

func TestShellQuote(t *testing.T) {
	for _, s := range []string{"", "a b", "it's", `$x "y" \z`, "^Test(A|B)$"} {
		out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("sh printf %s = %q, %v; want %q", shellQuote(s), out, err, s)
		}
	}
}

func TestInitScript(t *testing.T) {
	s := initScript(&Config{Run: "Test'X"}, []string{"dummy", "8021q"},
		[]testPackage{{importPath: "a/b", name: "a_b", cwd: "/src/b"}, {importPath: "a/c", name: "a_c", cwd: "/t/a_c"}})
	for _, want := range []string{
		"modprobe dummy numdummies=0 ",
		"modprobe 8021q ",
		"echo '@@vmtest:ready@@'",
		"cd '/src/b'\necho '@@vmtest:start 0@@'\n/t/a_b.test '-test.v=true' '-test.paniconexit0' '-test.run=Test'\\''X'\n",
		"echo \"@@vmtest:exit 1 $?@@\"",
		"poweroff -f",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("init script lacks %q:\n%s", want, s)
		}
	}
	if out, err := exec.Command("sh", "-n", "-c", s).CombinedOutput(); err != nil {
		t.Errorf("sh -n: %v: %s", err, out)
	}
}

func TestConsole(t *testing.T) {
	var out, log bytes.Buffer
	cfg := &Config{Out: &out, Log: &log}
	pkgs := []testPackage{{importPath: "a/b"}, {importPath: "a/c"}, {importPath: "a/d"}}
	res := &Result{Packages: []PackageResult{{ImportPath: "a/b"}, {ImportPath: "a/x", NoTests: true}, {ImportPath: "a/c"}, {ImportPath: "a/d"}}}
	c := newConsole(cfg, pkgs, res, time.Now())
	c.read(strings.NewReader("SeaBIOS\r\n" +
		"vmtest-init: modprobe x failed\r\n" +
		"@@vmtest:ready@@\r\n" +
		"@@vmtest:start 0@@\r\n=== RUN   TestA\r\n--- PASS: TestA (0.00s)\r\nPASS\r\n@@vmtest:exit 0 0@@\r\n" +
		"@@vmtest:start 1@@\r\n=== RUN   TestB\r\nno newline@@vmtest:exit 1 1@@\r\n" +
		"@@vmtest:start 2@@\r\n=== RUN   TestC\r\n"))

	got := regexpTimes(out.String())
	want := "=== RUN   TestA\n--- PASS: TestA (0.00s)\nPASS\nok  \ta/b\tT\n" +
		"=== RUN   TestB\nno newline\nFAIL\ta/c\tT\n" +
		"=== RUN   TestC\n"
	if got != want {
		t.Errorf("out:\n%s\nwant:\n%s", got, want)
	}
	if log.String() != "vmtest-init: modprobe x failed\n" {
		t.Errorf("log = %q", log.String())
	}
	if !c.ready || c.done() {
		t.Errorf("ready = %v, done = %v; want true, false", c.ready, c.done())
	}
	if r := res.Packages; !r[0].Passed() || !r[1].Passed() || r[2].Passed() || r[2].ExitCode != 1 || r[3].Finished || res.Passed() {
		t.Errorf("results = %+v", r)
	}
}

// regexpTimes replaces the seconds in ok and FAIL lines with T.
func regexpTimes(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if f := strings.Split(l, "\t"); len(f) == 3 && (f[0] == "ok  " || f[0] == "FAIL") && strings.HasSuffix(f[2], "s") {
			if _, err := strconv.ParseFloat(strings.TrimSuffix(f[2], "s"), 64); err == nil {
				lines[i] = f[0] + "\t" + f[1] + "\tT"
			}
		}
	}
	return strings.Join(lines, "\n")
}

func TestWriteInitramfs(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "init"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/busybox", filepath.Join(root, "sh")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "initrd.gz")
	if err := writeInitramfs(root, out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		name, body string
		mode       uint64
	}
	var got []entry
	for len(data) >= 110 {
		if string(data[:6]) != "070701" {
			t.Fatalf("bad magic %q", data[:6])
		}
		field := func(i int) uint64 {
			v, err := strconv.ParseUint(string(data[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		mode, size, namesize := field(1), field(6), field(11)
		name := string(data[110 : 110+namesize-1])
		off := (110 + int(namesize) + 3) &^ 3
		body := string(data[off : off+int(size)])
		data = data[(off+int(size)+3)&^3:]
		got = append(got, entry{name, body, mode})
		if name == "TRAILER!!!" {
			break
		}
	}
	want := []entry{
		{"dev", "", 0o040755},
		{"dev/console", "", 0o020600},
		{"init", "#!/bin/sh\n", 0o100755},
		{"sh", "/bin/busybox", 0o120777},
		{"TRAILER!!!", "", 0},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("entries = %+v\nwant %+v", got, want)
	}
}

func TestExtractVmlinuxGzip(t *testing.T) {
	var payload bytes.Buffer
	zw := gzip.NewWriter(&payload)
	zw.Write([]byte("\x7fELF kernel"))
	zw.Close()
	payload.Write([]byte{1, 2, 3, 4}) // the appended size

	bz := make([]byte, 5*512)
	bz[0x1f1] = 4
	copy(bz[0x202:], "HdrS")
	bz[0x206], bz[0x207] = 0x0f, 0x02
	bz[0x248] = 16 // payload_offset
	bz[0x24c] = byte(payload.Len())
	bz = append(bz, make([]byte, 16)...)
	bz = append(bz, payload.Bytes()...)

	got, err := extractVmlinux(bz)
	if err != nil || string(got) != "\x7fELF kernel" {
		t.Errorf("extractVmlinux = %q, %v", got, err)
	}
	if _, err := extractVmlinux(bz[:100]); err == nil {
		t.Error("extractVmlinux of a short file: no error")
	}
}

// TestSmoke boots the VM with a throwaway module whose tests use 8021q and
// dummy, and one that fails. It needs root, qemu and apt, and takes about a
// minute, so it runs only with NODEAGENT_VM_SMOKE=1.
func TestSmoke(t *testing.T) {
	if os.Getenv("NODEAGENT_VM_SMOKE") != "1" {
		t.Skip("set NODEAGENT_VM_SMOKE=1 to boot the VM")
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":                    "module example.com/smoke\n\ngo 1.22\n",
		"vlan/testdata/hello.txt":   "hello\n",
		"vlan/vlan_test.go":         smokeVLANTest,
		"fail/fail_test.go":         "package fail\n\nimport \"testing\"\n\nfunc TestFails(t *testing.T) { t.Fatal(\"deliberate\") }\n",
		"notests/notests.go":        "package notests\n",
		"passonly/passonly_test.go": "package passonly\n\nimport \"testing\"\n\nfunc TestOK(t *testing.T) {}\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	var out bytes.Buffer
	cfg := Config{Dir: dir, Packages: []string{"./vlan", "./notests", "./fail", "./passonly"}, Out: &out, VMTimeout: 5 * time.Minute}
	res, err := Run(context.Background(), cfg)
	// Quoted line by line, so that the throwaway packages' own "--- FAIL"
	// lines are not taken for this run's by a summary that reads the log.
	t.Logf("output of the VM run:\n%s", "vm| "+strings.ReplaceAll(strings.TrimRight(out.String(), "\n"), "\n", "\nvm| "))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel %s, initrd %d bytes, boot %v, total %v", res.KernelVersion, res.InitrdBytes, res.Boot, res.Total)
	pass := map[string]bool{}
	for _, p := range res.Packages {
		pass[p.ImportPath] = p.Passed()
	}
	want := map[string]bool{"example.com/smoke/vlan": true, "example.com/smoke/notests": true, "example.com/smoke/fail": false, "example.com/smoke/passonly": true}
	if !reflect.DeepEqual(pass, want) || res.Passed() {
		t.Errorf("passed = %v, want %v", pass, want)
	}
	for _, s := range []string{"--- PASS: TestDummyVLAN", "ok  \texample.com/smoke/vlan\t", "FAIL\texample.com/smoke/fail\t", "?   \texample.com/smoke/notests\t[no test files]"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q", s)
		}
	}
}

const smokeVLANTest = `package vlan

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestDummyVLAN(t *testing.T) {
	if os.Getenv("NODEAGENT_IN_VM") != "1" {
		t.Fatal("NODEAGENT_IN_VM is not 1")
	}
	if b, err := os.ReadFile("testdata/hello.txt"); err != nil || string(b) != "hello\n" {
		t.Fatalf("testdata: %q, %v", b, err)
	}
	for _, args := range [][]string{
		{"link", "add", "dummy0", "type", "dummy"},
		{"link", "add", "link", "dummy0", "name", "dummy0.50", "type", "vlan", "id", "50"},
		{"link", "add", "wg0", "type", "wireguard"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	out, err := exec.Command("ip", "-d", "link", "show", "dummy0.50").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "vlan protocol 802.1Q id 50") {
		t.Fatalf("ip -d link show: %v: %s", err, out)
	}
}
`
