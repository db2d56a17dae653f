# sluice in a container: built in a Go image, run from a slim Debian image
# as an unprivileged user. docker-compose.yml uses it for the
# production-like stack.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/sluice ./cmd/sluice

FROM debian:bookworm-slim
RUN useradd --system --create-home --uid 10001 sluice
COPY --from=build /out/sluice /usr/local/bin/sluice
USER sluice
WORKDIR /home/sluice
EXPOSE 50051 8080
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--grpc-addr", "0.0.0.0:50051", "--http-addr", "0.0.0.0:8080"]
