package daemons_test

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
)

// BenchmarkKillToReady measures the time from SIGKILL of a ready daemon to the
// supervisor reporting the restarted daemon ready (default options, except a
// StableAfter that lets every kill count as the death of a stable daemon, so
// no backoff is added: what is measured is detection, the RestartDelay of
// 500 ms, clean-up and restart).
//
//	go test ./pkg/daemons -run '^$' -bench KillToReady -benchtime 50x
func BenchmarkKillToReady(b *testing.B) {
	f := newFixture(b, "ok")
	s, stop := f.run(b, daemons.Options{StableAfter: time.Nanosecond})
	waitReady(b, s)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pid := s.Status().PID
		start := time.Now()
		require.NoError(b, syscall.Kill(pid, syscall.SIGKILL))
		for {
			st := s.Status()
			if st.Restarts == i+1 && st.State == daemons.StateReady {
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	require.NoError(b, stop())
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
	b.ReportMetric(0, "ns/op") // the p50/max above are the result
}
