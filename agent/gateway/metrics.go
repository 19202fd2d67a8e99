package gateway

import "github.com/prometheus/client_golang/prometheus"

// The role's metrics, read from its Status at each scrape.
var (
	descState = prometheus.NewDesc("nodeagent_gateway_state",
		"This node's state in the gateway role: 1 for the state it is in (Holder, Standby, Claiming, Fenced), 0 for the others.",
		[]string{"role", "state"}, nil)
	descHolder = prometheus.NewDesc("nodeagent_gateway_holder",
		"1 while this node answers for the gateway role's addresses; summed over the candidates, the role's holders (1 is right, 0 is an outage, 2 never happens).",
		[]string{"role"}, nil)
	descTransitions = prometheus.NewDesc("nodeagent_gateway_transitions_total",
		"Changes of this node's state in the gateway role since the daemon started.",
		[]string{"role"}, nil)
	descTakeOver = prometheus.NewDesc("nodeagent_gateway_takeover_seconds",
		"How long this node's last take-over of the gateway role took, from the Lease being its own to the addresses claimed (0 before the first).",
		[]string{"role"}, nil)
	descLease = prometheus.NewDesc("nodeagent_gateway_lease_ok",
		"1 while the role's Lease was read or written within its duration.",
		[]string{"role"}, nil)
)

type collector struct{ r *Role }

// Collector is the role's metrics for a prometheus registry.
func (r *Role) Collector() prometheus.Collector { return collector{r} }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descHolder, descTransitions, descTakeOver, descLease} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Status()
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, st := range []State{Holder, Standby, Claiming, Fenced} {
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, b(s.State == st), s.Role, string(st))
	}
	ch <- prometheus.MustNewConstMetric(descHolder, prometheus.GaugeValue, b(s.State == Holder), s.Role)
	ch <- prometheus.MustNewConstMetric(descTransitions, prometheus.CounterValue, float64(s.Transitions), s.Role)
	ch <- prometheus.MustNewConstMetric(descTakeOver, prometheus.GaugeValue, s.TookOver.Seconds(), s.Role)
	ch <- prometheus.MustNewConstMetric(descLease, prometheus.GaugeValue, b(s.LeaseOK), s.Role)
}
