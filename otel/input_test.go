package failoverotel_test

import (
	"fmt"
	"strings"
	"testing"

	failoverotel "github.com/failover-go/failover/otel"
)

// NewProducer refuses a nil Transport at once, saying so: the producer it
// returned panicked in every collection, on the Reader's goroutine, which
// for a PeriodicReader ends the program.
func TestNewProducerNil(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "nil Transport") {
			t.Fatalf("NewProducer(nil) panicked with %v; want a panic that names the nil Transport", v)
		}
	}()
	failoverotel.NewProducer(nil)
}
