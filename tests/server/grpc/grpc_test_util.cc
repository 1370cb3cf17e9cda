#include "tests/server/grpc/grpc_test_util.h"

#include <stdlib.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace tokensel::server::testing {
namespace {

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// A length-delimited field (wire type 2) with a number < 16.
std::string LengthDelimited(int field, const std::string& value) {
  std::string out;
  out.push_back(static_cast<char>((field << 3) | 2));
  out.push_back(static_cast<char>(value.size()));  // values here are < 128 bytes
  out += value;
  return out;
}

// Writes one request, half-closes, collects every response.
class OneRequestBidi : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  OneRequestBidi(grpc::GenericStub* stub, const std::string& method, const std::string& request)
      : request_(ToByteBuffer(request)) {
    stub->PrepareBidiStreamingCall(&ctx_, method, grpc::StubOptions(), this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }
  void OnWriteDone(bool) override { StartWritesDone(); }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    responses_.push_back(FromByteBuffer(response_));
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  grpc::Status Await() {
    done_.WaitForNotification();
    return status_;
  }
  const std::vector<std::string>& responses() const { return responses_; }

 private:
  grpc::ClientContext ctx_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::vector<std::string> responses_;
  grpc::Status status_;
  absl::Notification done_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<InProcessServer>> InProcessServer::Start(ServerOptions options) {
  std::unique_ptr<InProcessServer> s(new InProcessServer());
  char tmpl[] = "/tmp/tokensel-grpc-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  s->dir_ = tmpl;
  s->address_ = absl::StrCat("unix://", s->dir_, "/tokensel.sock");
  options.listen = {s->address_};
  options.backend = "cpu";
  // No exposer on the production port; tests that want one ask for 127.0.0.1:0.
  if (options.metrics_address == ServerOptions().metrics_address) options.metrics_address.clear();
  if (options.threads == 0) options.threads = 2;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(std::move(options));
  if (!server.ok()) return server.status();
  s->server_ = *std::move(server);
  s->channel_ = grpc::CreateChannel(s->address_, grpc::InsecureChannelCredentials());
  s->stub_ = v1::TokenSelect::NewStub(s->channel_);
  return s;
}

InProcessServer::~InProcessServer() {
  stub_.reset();
  channel_.reset();
  server_.reset();
  ::rmdir(dir_.c_str());
}

std::string InProcessServer::OpenSession(const std::string& client_name) {
  grpc::ClientContext ctx;
  v1::OpenSessionRequest request;
  request.set_client_name(client_name);
  v1::OpenSessionResponse response;
  if (!stub_->OpenSession(&ctx, request, &response).ok()) return "";
  return response.session_id();
}

std::unique_ptr<grpc::ClientContext> InProcessServer::Context(const std::string& session) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("tokensel-session", session);
  return ctx;
}

std::unique_ptr<InProcessServer> StartServer(ServerOptions options) {
  absl::StatusOr<std::unique_ptr<InProcessServer>> s = InProcessServer::Start(std::move(options));
  if (!s.ok()) {
    ADD_FAILURE() << "InProcessServer::Start: " << s.status();
    return nullptr;
  }
  return *std::move(s);
}

absl::Status ToAbsl(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<int> HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  // HealthCheckRequest { string service = 1; }
  const grpc::ByteBuffer request = ToByteBuffer(LengthDelimited(1, service));
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpc(status);
  // HealthCheckResponse { ServingStatus status = 1; }
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(FromByteBuffer(response))) {
    return absl::DataLossError("unparsable HealthCheckResponse");
  }
  for (int i = 0; i < fields.field_count(); ++i) {
    if (fields.field(i).number() == 1) return static_cast<int>(fields.field(i).varint());
  }
  return 0;  // UNKNOWN (the default value is not on the wire)
}

absl::StatusOr<std::vector<std::string>> ReflectionListServices(
    const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  // ServerReflectionRequest { string list_services = 7; }
  OneRequestBidi call(&stub, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                      LengthDelimited(7, "*"));
  grpc::Status status = call.Await();
  if (!status.ok()) return FromGrpc(status);
  std::vector<std::string> names;
  for (const std::string& bytes : call.responses()) {
    // ServerReflectionResponse { ListServiceResponse list_services_response = 6; }
    // ListServiceResponse { repeated ServiceResponse service = 1; }
    // ServiceResponse { string name = 1; }
    google::protobuf::UnknownFieldSet response;
    if (!response.ParseFromString(bytes)) return absl::DataLossError("bad reflection response");
    for (int i = 0; i < response.field_count(); ++i) {
      if (response.field(i).number() != 6) continue;
      google::protobuf::UnknownFieldSet list;
      if (!list.ParseFromString(response.field(i).length_delimited())) {
        return absl::DataLossError("bad ListServiceResponse");
      }
      for (int j = 0; j < list.field_count(); ++j) {
        google::protobuf::UnknownFieldSet service;
        if (list.field(j).number() != 1 ||
            !service.ParseFromString(list.field(j).length_delimited())) {
          continue;
        }
        for (int k = 0; k < service.field_count(); ++k) {
          if (service.field(k).number() == 1) names.push_back(service.field(k).length_delimited());
        }
      }
    }
  }
  return names;
}

v1::Tensor InlineTensor(v1::DType dtype, std::vector<int64_t> shape, std::string data) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_inline_data(std::move(data));
  return t;
}

}  // namespace tokensel::server::testing
