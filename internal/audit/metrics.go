package audit

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the audit service's figures, by record stream. NewMetrics(nil) counts without
// exporting.
type Metrics struct {
	// Lag is how many messages of each stream the audit has not written yet: its consumer's
	// pending and unacknowledged messages, read every two seconds and after each batch.
	Lag *prometheus.GaugeVec
	// LagSeconds is how far behind the record the audit's rows are: the age of the oldest
	// message of the last batch written when it was written, or of the oldest held while the
	// database is away; 0 once nothing was written for two seconds and nothing is held.
	LagSeconds *prometheus.GaugeVec
	// Records counts the records read, by outcome: projected, or error (an audit_errors row).
	Records *prometheus.CounterVec
	// Batches observes each batch's write, by outcome (ok, retry).
	Batches *prometheus.HistogramVec
	// Up is 1 while the database takes the audit's writes, 0 while it does not.
	Up prometheus.Gauge
}

// NewMetrics returns the audit's metrics, registered with reg when it is not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hermes_audit_lag_messages",
			Help: "Messages of a record stream the audit has not written to PostgreSQL yet."}, []string{"stream"}),
		LagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hermes_audit_lag_seconds",
			Help: "How far behind the record the audit's rows are: the age of the oldest message of its last batch when written, or of the oldest held unwritten."}, []string{"stream"}),
		Records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_audit_records_total",
			Help: "Records the audit read, by outcome (projected, error: a row of hermes_audit_errors)."}, []string{"outcome"}),
		Batches: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hermes_audit_batch_seconds",
			Help: "Time to write one batch to PostgreSQL, by outcome (ok, retry).", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}, []string{"outcome"}),
		Up: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hermes_audit_database_up",
			Help: "1 while PostgreSQL takes the audit's writes, 0 while it does not."}),
	}
	if reg != nil {
		reg.MustRegister(m.Lag, m.LagSeconds, m.Records, m.Batches, m.Up)
	}
	return m
}
