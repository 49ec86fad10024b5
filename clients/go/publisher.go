// Publishes an order's payment timeout to order-timeout, with amqp091-go
// (github.com/rabbitmq/amqp091-go; Debian: golang-github-rabbitmq-amqp091-go-dev).
//
// Call it right after the transaction that INSERTs the order has committed:
//
//	timeouts := NewPublisher(os.Getenv("AMQP_URL"), Schedule)
//	defer timeouts.Close()
//	if err := timeouts.PublishTimeout(ctx, order.ID, order.ExpiresAt); err != nil {
//		log.Printf("%v (the sweeper cancels it later)", err) // never roll the order back
//	}
//
// Copy this file into your package. One Publisher per process, reused; it is
// safe for concurrent use (one publish at a time). The contract it follows is
// README.md's "Publishing a timeout"; clients/README.md has the command-line
// form the tests drive.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// Exchange is the service's entry exchange (durable, direct).
	Exchange = "order-timeout"
	// Schedule is the routing key for any deadline.
	Schedule = "schedule"

	maxAttempts    = 5
	firstBackoff   = 100 * time.Millisecond
	confirmTimeout = 5 * time.Second
)

// LaneRoutingKey is the routing key of the lane for a payment window:
// 30 min → "schedule.1800s".
func LaneRoutingKey(window time.Duration) string {
	return fmt.Sprintf("%s.%ds", Schedule, int64(window/time.Second))
}

// Publisher publishes timeouts with publisher confirms on one connection.
type Publisher struct {
	url        string
	routingKey string

	mu       sync.Mutex
	conn     *amqp.Connection
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
}

// NewPublisher publishes to the broker at url (amqp:// or amqps://, the vhost
// in the path) with routingKey: Schedule, or LaneRoutingKey when the shop
// gives every order the same payment window and the service runs that window
// as a lane. It connects on first use.
func NewPublisher(url, routingKey string) *Publisher {
	return &Publisher{url: url, routingKey: routingKey}
}

// PublishTimeout sends {"order_id", "cancel_at"}: the deadline the order row
// holds (its expires_at).
func (p *Publisher) PublishTimeout(ctx context.Context, orderID string, cancelAt time.Time) error {
	return p.publish(ctx, orderID, map[string]any{
		"order_id":  orderID,
		"cancel_at": cancelAt.UTC().Format(time.RFC3339Nano),
	})
}

// PublishTimeoutAfter sends {"order_id", "created_at", "timeout_ms"}: a
// creation time and a window.
func (p *Publisher) PublishTimeoutAfter(ctx context.Context, orderID string, createdAt time.Time, timeout time.Duration) error {
	return p.publish(ctx, orderID, map[string]any{
		"order_id":   orderID,
		"created_at": createdAt.UTC().Format(time.RFC3339Nano),
		"timeout_ms": timeout.Milliseconds(),
	})
}

// PublishOrderID sends {"order_id"}: the service reads the deadline from the
// order row.
func (p *Publisher) PublishOrderID(ctx context.Context, orderID string) error {
	return p.publish(ctx, orderID, map[string]any{"order_id": orderID})
}

// publish makes one persistent, confirmed, mandatory publish, tried up to
// maxAttempts times with doubling backoff (a nack, no confirm in time, a
// message no queue took, a lost connection). If every attempt fails it
// returns the error, and the caller must NOT roll the order back: its row is
// committed and the service's sweeper cancels every unpaid order whose
// deadline passed more than its grace period ago (60 s by default), message or
// not. A failed publish makes that order's cancellation late, never lost; log it.
func (p *Publisher) publish(ctx context.Context, orderID string, body map[string]any) error {
	payload, err := json.Marshal(body)
	if err != nil {
		return err
	}
	msg := amqp.Publishing{
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent, // survives a broker restart
		Body:         payload,
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var last error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		if last = p.try(ctx, msg); last == nil {
			return nil
		}
		if attempt < maxAttempts {
			select {
			case <-time.After(firstBackoff << (attempt - 1)):
			case <-ctx.Done():
				return fmt.Errorf("timeout of order %s not published: %w", orderID, ctx.Err())
			}
		}
	}
	return fmt.Errorf("timeout of order %s not published: %w", orderID, last)
}

func (p *Publisher) try(ctx context.Context, msg amqp.Publishing) error {
	if err := p.connect(); err != nil {
		return err
	}
	// mandatory: a message no queue takes (a lane key the service has not
	// bound yet) comes back instead of vanishing.
	if err := p.ch.PublishWithContext(ctx, Exchange, p.routingKey, true, false, msg); err != nil {
		p.reset()
		return err
	}
	timer := time.NewTimer(confirmTimeout)
	defer timer.Stop()
	select {
	case c, ok := <-p.confirms:
		if !ok {
			p.reset()
			return fmt.Errorf("the channel closed before the confirm")
		}
		if !c.Ack {
			return fmt.Errorf("the broker refused it (nack)")
		}
		// The broker sends a return before the ack of the same message.
		select {
		case r := <-p.returns:
			return fmt.Errorf("no queue took it (%d %s): is the service running with this routing key?", r.ReplyCode, r.ReplyText)
		default:
			return nil
		}
	case <-timer.C:
		p.reset()
		return fmt.Errorf("no confirm within %v", confirmTimeout)
	case <-ctx.Done():
		p.reset()
		return ctx.Err()
	}
}

func (p *Publisher) connect() error {
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	p.reset()
	conn, err := amqp.DialConfig(p.url, amqp.Config{
		Dial:       amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "order-service"},
	})
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return err
	}
	p.conn, p.ch = conn, ch
	p.confirms = ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	p.returns = ch.NotifyReturn(make(chan amqp.Return, 1))
	return nil
}

func (p *Publisher) reset() {
	if p.conn != nil {
		p.conn.Close()
	}
	p.conn, p.ch = nil, nil
}

// Close closes the connection.
func (p *Publisher) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reset()
}
