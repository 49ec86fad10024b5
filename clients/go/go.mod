module example.com/order-timeout-publisher

go 1.19

require github.com/rabbitmq/amqp091-go v1.5.0
