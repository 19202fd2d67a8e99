package route

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"golang.org/x/sys/unix"
)

const benchTables = 10

// benchLab is a namespace with a veth pair to route through.
func benchLab(b *testing.B) *testenv.NetNS {
	ns := testenv.NewNetNS(b)
	peer := testenv.NewNetNS(b)
	ns.Veth(b, "v0", peer, "v1")
	ns.Exec(b, "ip", "addr", "add", "10.255.0.1/16", "dev", "v0")
	return ns
}

func benchDesired(n int) Desired {
	var d Desired
	for i := 0; i < n; i++ {
		table := 100 + i%benchTables
		d.Routes = append(d.Routes, Route{
			Table: table, To: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i % 256), 0}), 24),
			Type: unix.RTN_UNICAST, Via: netip.MustParseAddr("10.255.0.2"), Dev: "v0",
		})
		d.Rules = append(d.Rules, Rule{
			Priority: 1000 + i, Family: unix.AF_INET, Table: table, Action: unix.FR_ACT_TO_TBL, Suppress: -1,
			From: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(i/256), byte(i % 256), 0}), 24),
		})
	}
	return d
}

func ipBenchCommands(n int) []string {
	var cmds []string
	for i := 0; i < n; i++ {
		table := 100 + i%benchTables
		cmds = append(cmds,
			fmt.Sprintf("route add 10.%d.%d.0/24 via 10.255.0.2 dev v0 table %d proto 147", i/256, i%256, table),
			fmt.Sprintf("rule add priority %d from 172.%d.%d.0/24 lookup %d proto 147", 1000+i, 16+i/256, i%256, table))
	}
	return cmds
}

func benchSync(b *testing.B, ns *testenv.NetNS, d Desired) Plan {
	o, err := Observe(context.Background(), ns.Host.Snapshot(), d)
	if err != nil {
		b.Fatal(err)
	}
	p := MakePlan(d, o)
	if _, rep := Apply(context.Background(), ns.Host.Snapshot(), p); rep.Err() != nil {
		err := rep.Err()
		b.Fatal(err)
	}
	return p
}

// BenchmarkConverge1000RulesAndRoutes puts nodeagent's cold converge of
// 1000 rules and 1000 routes across 10 tables beside `ip -batch` and one
// `ip` process per object doing the same, and times the no-op sync of the
// result (best of 5). Run with -benchtime=1x.
func BenchmarkConverge1000RulesAndRoutes(b *testing.B) {
	const n = 1000
	for i := 0; i < b.N; i++ {
		var cold, noop, batch, perProc time.Duration
		var writes int64
		{
			ns := benchLab(b)
			d := benchDesired(n)
			start := time.Now()
			benchSync(b, ns, d)
			cold = time.Since(start)
			before := ns.Host.Writes()
			for j := 0; j < 5; j++ {
				s := time.Now()
				if p := benchSync(b, ns, d); !p.Empty() {
					b.Fatalf("no-op sync planned:\n%s", p)
				}
				if e := time.Since(s); noop == 0 || e < noop {
					noop = e
				}
			}
			writes = ns.Host.Writes() - before
		}
		{
			ns := benchLab(b)
			f, _ := os.CreateTemp(b.TempDir(), "batch")
			f.WriteString(strings.Join(ipBenchCommands(n), "\n") + "\n")
			f.Close()
			start := time.Now()
			if out, err := exec.Command("ip", "-n", ns.Name, "-batch", f.Name()).CombinedOutput(); err != nil {
				b.Fatalf("ip -batch: %v\n%s", err, out)
			}
			batch = time.Since(start)
		}
		{
			ns := benchLab(b)
			start := time.Now()
			for _, c := range ipBenchCommands(n) {
				if out, err := exec.Command("ip", append([]string{"-n", ns.Name}, strings.Fields(c)...)...).CombinedOutput(); err != nil {
					b.Fatalf("ip %s: %v\n%s", c, err, out)
				}
			}
			perProc = time.Since(start)
		}
		b.ReportMetric(cold.Seconds()*1000, "nodeagent-ms")
		b.ReportMetric(batch.Seconds()*1000, "ip-batch-ms")
		b.ReportMetric(perProc.Seconds()*1000, "ip-per-object-ms")
		b.ReportMetric(cold.Seconds()/batch.Seconds(), "x-ip-batch")
		b.ReportMetric(perProc.Seconds()/cold.Seconds(), "speedup-vs-per-object")
		b.ReportMetric(noop.Seconds()*1000, "noop-ms")
		b.ReportMetric(float64(writes), "noop-writes")
		fmt.Printf("\n%d rules + %d routes in %d tables, cold converge:\n"+
			"  nodeagent            %8.1f ms   %.2fx ip -batch (target <= 1.5x)   %.1fx faster than per-object (target >= 10x)\n"+
			"  ip -batch            %8.1f ms\n"+
			"  ip, one per object   %8.1f ms\n"+
			"no-op sync of the same: %.1f ms, %d writes (target 0)\n\n",
			n, n, benchTables, cold.Seconds()*1000, cold.Seconds()/batch.Seconds(), perProc.Seconds()/cold.Seconds(),
			batch.Seconds()*1000, perProc.Seconds()*1000, noop.Seconds()*1000, writes)
	}
}
