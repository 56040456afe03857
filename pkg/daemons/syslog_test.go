package daemons_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
)

func TestParseSyslog(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want daemons.SyslogMessage
	}{
		{"<29>Nov 29 21:48:51 nvidia-persistenced[1234]: Started (1234)",
			daemons.SyslogMessage{Facility: 3, Severity: 5, Tag: "nvidia-persistenced", PID: 1234, Message: "Started (1234)"}},
		{"<27>Jan  2 03:04:05 nvidia-persistenced: Failed to open libnvidia-cfg.so.1: no such file\n",
			daemons.SyslogMessage{Facility: 3, Severity: 3, Tag: "nvidia-persistenced", Message: "Failed to open libnvidia-cfg.so.1: no such file"}},
		{"<31>Jan  2 03:04:05 nvidia-persistenced[7]: device 0000:01:00.0 - registered",
			daemons.SyslogMessage{Facility: 3, Severity: 7, Tag: "nvidia-persistenced", PID: 7, Message: "device 0000:01:00.0 - registered"}},
		{"no header at all", daemons.SyslogMessage{Facility: 1, Severity: 6, Message: "no header at all"}},
		{"<12>free text: with a colon and spaces", daemons.SyslogMessage{Facility: 1, Severity: 4, Message: "free text: with a colon and spaces"}},
	} {
		t.Run(tc.in, func(t *testing.T) {
			assert.Equal(t, tc.want, daemons.ParseSyslog(tc.in))
		})
	}
	assert.Equal(t, slog.LevelError, daemons.SyslogMessage{Severity: 3}.Level())
	assert.Equal(t, slog.LevelWarn, daemons.SyslogMessage{Severity: 4}.Level())
	assert.Equal(t, slog.LevelInfo, daemons.SyslogMessage{Severity: 5}.Level())
	assert.Equal(t, slog.LevelDebug, daemons.SyslogMessage{Severity: 7}.Level())
}

// The daemon's syslog lines reach our logger through the sink.
func TestSyslogSinkForwardsDaemonLines(t *testing.T) {
	f := newFixture(t, "ok")
	logPath := filepath.Join(shortTempDir(t), "log")
	f.spec.Env = append(f.spec.Env, "FAKEDAEMON_SYSLOG="+logPath)

	sink, err := daemons.ListenSyslog(f.log, logPath)
	require.NoError(t, err)
	fi, err := os.Stat(logPath)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "only root, as our daemons run, can write")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- sink.Serve(ctx) }()

	s, stop := f.run(t, fast)
	waitReady(t, s)
	pid := s.Status().PID
	require.NoError(t, stop())
	want := `level=INFO msg="Started (` + strconv.Itoa(pid) + `)" source=syslog tag=nvidia-persistenced pid=` + strconv.Itoa(pid)
	waitFor(t, "the daemon's lines", func() bool {
		return strings.Contains(f.logs.String(), want) && strings.Contains(f.logs.String(), `msg="Shutdown (`+strconv.Itoa(pid)+`)"`)
	})

	// Only one reader: a second sink refuses the live socket.
	_, err = daemons.ListenSyslog(f.log, logPath)
	assert.ErrorContains(t, err, "another syslog reader is listening")

	cancel()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	assert.NoFileExists(t, logPath, "the socket is removed on stop")
}

func TestListenSyslogRefusesNonSocketsAndReplacesDeadOnes(t *testing.T) {
	dir := shortTempDir(t)
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	_, err := daemons.ListenSyslog(discard(), file)
	assert.ErrorContains(t, err, "exists and is not a socket")
	b, _ := os.ReadFile(file)
	assert.Equal(t, "x", string(b), "left as it was")

	dead := filepath.Join(dir, "dead")
	// A socket file nobody reads any more (a syslog reader that died).
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrUnix{Name: dead}))
	require.NoError(t, unix.Close(fd))
	sink, err := daemons.ListenSyslog(discard(), dead)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, sink.Serve(ctx))
}

// TestSyslogSinkTakesOnlyOurDaemonsLines: the socket is the host's /dev/log. Lines of other
// tags are dropped, a flood of our tag is cut to the rate limit, and the drops are reported;
// the last line taken of each tag is kept.
func TestSyslogSinkTakesOnlyOurDaemonsLines(t *testing.T) {
	logs := &testutil.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	path := filepath.Join(shortTempDir(t), "log")

	sink, err := daemons.ListenSyslog(log, path)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- sink.Serve(ctx) }()

	c, err := net.Dial("unixgram", path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	send := func(tag, msg string) {
		_, err := fmt.Fprintf(c, "<11>%s %s[42]: %s", time.Now().Format(time.Stamp), tag, msg)
		require.NoError(t, err)
	}

	send("sshd", "Accepted password for root")
	send("kernel", "forged emergency")
	const flood = 1000
	begin := time.Now()
	for i := range flood {
		send("nvidia-persistenced", fmt.Sprintf("line %d", i))
	}
	time.Sleep(200 * time.Millisecond) // the limit lets lines through again
	send("nvidia-persistenced", "the end")
	waitFor(t, "the last line", func() bool { return strings.Contains(logs.String(), `msg="the end"`) })
	elapsed := time.Since(begin)

	out := logs.String()
	assert.NotContains(t, out, "Accepted password")
	assert.NotContains(t, out, "forged emergency")
	taken := strings.Count(out, "tag=nvidia-persistenced")
	assert.LessOrEqual(t, taken, 100+int(20*elapsed.Seconds())+2, "the burst and the rate bound what is taken")
	assert.Greater(t, taken, 1)
	assert.Contains(t, out, "syslog lines dropped")
	assert.Contains(t, out, "foreignTag=2")
	assert.Equal(t, "the end", sink.LastLine("nvidia-persistenced"), "the last line of warning or worse (all are <11>: err)")
	assert.Empty(t, sink.LastLine("sshd"))

	cancel()
	require.NoError(t, <-served)
}
