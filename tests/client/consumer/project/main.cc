// tokensel_consumer: links the installed tokensel::client.
//
//   tokensel_consumer            offline: builds a request, converts a status
//   tokensel_consumer <target>   online: info, session, shm buffer, a gather
//
// Prints "consumer ok ..." and exits 0, or prints the error and exits 1.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tokensel/client/client.h"
#include "tokensel/client/cuda_ipc_region.h"
#include "tokensel/client/session.h"
#include "tokensel/client/shared_region.h"
#include "tokensel/client/status.h"
#include "tokensel/client/tensor_ref.h"

namespace tc = ::tokensel::client;

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "consumer failed: %s\n", status.ToString().c_str());
  return 1;
}

int Offline() {
  const std::vector<int32_t> ids = {3, 1, 2};
  const tokensel::v1::Tensor t = tc::TensorRef::InlineValues<int32_t>(ids, {1, 3}).ToProto();
  absl::StatusOr<std::vector<int32_t>> back = tc::InlineValuesOf<int32_t>(t);
  if (!back.ok()) return Fail(back.status());
  if (*back != ids) return Fail(absl::InternalError("inline round trip differs"));
  const absl::Status s = tc::FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "x"));
  if (s.code() != absl::StatusCode::kNotFound) return Fail(absl::InternalError("status code"));
  std::printf("consumer ok offline (cuda=%d)\n", tc::CudaIpcRegion::BuiltWithCuda() ? 1 : 0);
  return 0;
}

int Online(const std::string& target) {
  absl::StatusOr<tc::Client> client = tc::Client::Connect(target, {.deadline = absl::Seconds(20)});
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<tokensel::v1::ServerInfo> info = client->GetServerInfo();
  if (!info.ok()) return Fail(info.status());
  absl::StatusOr<std::unique_ptr<tc::Session>> session = tc::Session::Open(*client);
  if (!session.ok()) return Fail(session.status());
  absl::StatusOr<tc::SharedRegion> region =
      tc::SharedRegion::Create(tc::SharedRegion::UniqueName(info->shm_prefix(), "consumer"), 4096,
                               {.required_prefix = info->shm_prefix()});
  if (!region.ok()) return Fail(region.status());
  const float acts[] = {0, 1, 10, 11, 20, 21};  // [1, 3, 2]
  std::memcpy(region->data(), acts, sizeof(acts));
  absl::StatusOr<tokensel::v1::BufferInfo> buffer =
      (*session)->RegisterBuffer(region->RegisterRequest("acts"));
  if (!buffer.ok()) return Fail(buffer.status());

  tokensel::v1::GatherTokensRequest req;
  *req.mutable_activations() =
      tc::TensorRef::InBuffer("acts").Dtype(tokensel::v1::DTYPE_FLOAT32).Shape({1, 3, 2}).ToProto();
  *req.mutable_indices() = tc::TensorRef::InlineValues<int32_t>({2, 0}, {1, 2}).ToProto();
  absl::StatusOr<tokensel::v1::OpResponse> resp = (*session)->client().GatherTokens(req);
  if (!resp.ok()) return Fail(resp.status());
  absl::StatusOr<std::vector<float>> out = tc::OutputValues<float>(*resp, "out");
  if (!out.ok()) return Fail(out.status());
  if (*out != std::vector<float>{20, 21, 0, 1}) return Fail(absl::InternalError("wrong gather"));
  std::printf("consumer ok online (server %s, backend %s)\n", info->version().c_str(),
              info->backend().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2) {
    std::fprintf(stderr, "usage: tokensel_consumer [target]\n");
    return 2;
  }
  return argc == 2 ? Online(argv[1]) : Offline();
}
