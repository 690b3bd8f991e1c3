// The Go peer of benchmarks/go_peer.py: etcd's own recipes (clientv3/concurrency, etcd 3.4
// sources) measured the way the Python benchmarks measure ours. Built by go_peer.py in GOPATH
// mode against Debian's packaged sources (golang-etcd-server-dev); prints one JSON object.
//
//	gopeer uncontended ENDPOINT SECONDS
//	gopeer contended ENDPOINT TASKS HANDOFFS
//	gopeer election ENDPOINT RUNS CANDIDATES SETTLE_SECONDS
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "gopeer:", err)
		os.Exit(1)
	}
}

func newClient(endpoint string) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	must(err)
	return cli
}

func percentile(values []float64, q float64) float64 {
	if len(values) == 0 {
		return 0
	}
	sorted := append([]float64(nil), values...)
	sort.Float64s(sorted)
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

func mean(values []float64) float64 {
	total := 0.0
	for _, v := range values {
		total += v
	}
	return total / float64(len(values))
}

// uncontended: Lock + Unlock back to back on one session, for SECONDS (after 200 warm-up cycles).
func uncontended(endpoint string, seconds float64) map[string]any {
	cli := newClient(endpoint)
	defer cli.Close()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	must(err)
	defer s.Close()
	m := concurrency.NewMutex(s, "/bench/go/uncontended")
	ctx := context.Background()
	cycle := func() {
		must(m.Lock(ctx))
		must(m.Unlock(ctx))
	}
	for i := 0; i < 200; i++ {
		cycle()
	}
	n, t0 := 0, time.Now()
	for time.Since(t0).Seconds() < seconds {
		cycle()
		n++
	}
	return map[string]any{"per_s": float64(n) / time.Since(t0).Seconds()}
}

// contended: TASKS goroutines, each with its own session and mutex on one path, acquire and
// release in a loop; hand-off latency from an Unlock call to the next Lock returning, over
// HANDOFFS hand-offs; the rate is 1 / mean latency (as benchmarks/locks.py reports ours).
func contended(endpoint string, tasks, handoffs int) map[string]any {
	cli := newClient(endpoint)
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var releasedAt time.Time
	latencies := make([]float64, 0, handoffs)
	var wg sync.WaitGroup
	sessions := make([]*concurrency.Session, tasks)
	for i := range sessions {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
		must(err)
		sessions[i] = s
	}
	for _, s := range sessions {
		wg.Add(1)
		go func(m *concurrency.Mutex) {
			defer wg.Done()
			for ctx.Err() == nil {
				if m.Lock(ctx) != nil {
					return
				}
				now := time.Now()
				mu.Lock()
				if !releasedAt.IsZero() {
					latencies = append(latencies, now.Sub(releasedAt).Seconds())
				}
				if len(latencies) >= handoffs {
					cancel()
				}
				releasedAt = time.Now()
				mu.Unlock()
				_ = m.Unlock(context.Background())
			}
		}(concurrency.NewMutex(s, "/bench/go/contended"))
	}
	wg.Wait()
	cancel()
	for _, s := range sessions {
		s.Close()
	}
	return map[string]any{
		"per_s":  1 / mean(latencies),
		"p50_ms": percentile(latencies, 0.5) * 1000,
		"p99_ms": percentile(latencies, 0.99) * 1000,
	}
}

// election: CANDIDATES campaigners (a client and a 2 s session each) on one election; RUNS
// times the leader resigns, timed from just before Resign to the next leader's Campaign
// returning; the old leader then campaigns again (at the back of the line).
func election(endpoint string, runs, candidates int, settle float64) map[string]any {
	type won struct {
		idx int
		at  time.Time
	}
	wins := make(chan won, candidates)
	elections := make([]*concurrency.Election, candidates)
	ctx := context.Background()
	for i := range elections {
		cli := newClient(endpoint)
		defer cli.Close()
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(2))
		must(err)
		defer s.Close()
		elections[i] = concurrency.NewElection(s, "/bench/go/election")
	}
	campaign := func(i int) {
		go func() {
			// An error ends only a campaign cut short when the measurement is over.
			if elections[i].Campaign(ctx, "cand-"+strconv.Itoa(i)) == nil {
				wins <- won{i, time.Now()}
			}
		}()
	}
	for i := range elections {
		campaign(i)
	}
	leader := (<-wins).idx
	handovers := make([]float64, 0, runs)
	for r := 0; r < runs; r++ {
		time.Sleep(time.Duration(settle * float64(time.Second)))
		started := time.Now()
		must(elections[leader].Resign(ctx))
		next := <-wins
		handovers = append(handovers, next.at.Sub(started).Seconds())
		campaign(leader)
		leader = next.idx
	}
	return map[string]any{
		"p50_ms": percentile(handovers, 0.5) * 1000,
		"p90_ms": percentile(handovers, 0.9) * 1000,
		"samples_ms": func() []float64 {
			out := make([]float64, len(handovers))
			for i, h := range handovers {
				out[i] = h * 1000
			}
			return out
		}(),
	}
}

func number(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	must(err)
	return v
}

func main() {
	if len(os.Args) < 3 {
		must(fmt.Errorf("usage: gopeer uncontended|contended|election ENDPOINT ARGS..."))
	}
	var out map[string]any
	switch endpoint := os.Args[2]; os.Args[1] {
	case "uncontended":
		out = uncontended(endpoint, number(os.Args[3]))
	case "contended":
		out = contended(endpoint, int(number(os.Args[3])), int(number(os.Args[4])))
	case "election":
		out = election(endpoint, int(number(os.Args[3])), int(number(os.Args[4])), number(os.Args[5]))
	default:
		must(fmt.Errorf("unknown figure %q", os.Args[1]))
	}
	must(json.NewEncoder(os.Stdout).Encode(out))
}
