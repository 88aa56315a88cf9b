#include "proto/wire_codec.h"

#include <map>

#include "absl/strings/str_cat.h"

namespace e3 {

absl::Status CheckProtocolVersion(int got, const std::string& peer) {
  if (got == kProtocolVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("protocol version mismatch: the ", peer, " speaks version ", got,
                                                    ", this build speaks version ", kProtocolVersion,
                                                    "; run matching teacher and student builds"));
}

v1::DType ToWire(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::DTYPE_F32;
    case DType::kF16: return v1::DTYPE_F16;
    case DType::kBF16: return v1::DTYPE_BF16;
    case DType::kI32: return v1::DTYPE_I32;
    case DType::kI64: return v1::DTYPE_I64;
    case DType::kU8: return v1::DTYPE_U8;
    case DType::kBool: return v1::DTYPE_BOOL;
    default: return v1::DTYPE_UNSPECIFIED;
  }
}

absl::StatusOr<DType> FromWire(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32: return DType::kF32;
    case v1::DTYPE_F16: return DType::kF16;
    case v1::DTYPE_BF16: return DType::kBF16;
    case v1::DTYPE_I32: return DType::kI32;
    case v1::DTYPE_I64: return DType::kI64;
    case v1::DTYPE_U8: return DType::kU8;
    case v1::DTYPE_BOOL: return DType::kBool;
    default: return absl::InvalidArgumentError(absl::StrCat("unknown wire dtype ", static_cast<int>(dtype)));
  }
}

v1::Transport ToWire(TransportKind kind) {
  switch (kind) {
    case TransportKind::kInline: return v1::TRANSPORT_INLINE;
    case TransportKind::kShm: return v1::TRANSPORT_SHM;
    case TransportKind::kCudaIpc: return v1::TRANSPORT_CUDA_IPC;
    case TransportKind::kNccl: return v1::TRANSPORT_NCCL;
  }
  return v1::TRANSPORT_UNSPECIFIED;
}

absl::StatusOr<TransportKind> FromWire(v1::Transport transport) {
  switch (transport) {
    case v1::TRANSPORT_INLINE: return TransportKind::kInline;
    case v1::TRANSPORT_SHM: return TransportKind::kShm;
    case v1::TRANSPORT_CUDA_IPC: return TransportKind::kCudaIpc;
    case v1::TRANSPORT_NCCL: return TransportKind::kNccl;
    default: return absl::InvalidArgumentError(absl::StrCat("unknown transport ", static_cast<int>(transport)));
  }
}

void DescribePayload(const PayloadBuffer& payload, v1::BatchDescriptor* out) {
  out->set_transport(ToWire(payload.transport()));
  out->set_payload_bytes(payload.total_bytes());
  for (const PayloadTensor& t : payload.tensors()) {
    v1::TensorRef* ref = out->add_tensors();
    ref->set_name(t.name);
    for (int64_t d : t.shape) ref->add_shape(d);
    ref->set_dtype(ToWire(t.dtype));
    if (const DeviceMemory* mem = payload.device_memory()) {
      if (payload.transport() == TransportKind::kCudaIpc) {
        v1::CudaIpcRef* ipc = ref->mutable_cuda_ipc();
        ipc->set_handle(mem->ipc_handle());
        ipc->set_offset(t.offset);
        ipc->set_nbytes(t.nbytes);
        ipc->set_device(mem->device());
      } else {
        v1::NcclRef* nccl = ref->mutable_nccl();
        nccl->set_peer(0);
        nccl->set_tag(0);
        nccl->set_offset(t.offset);
        nccl->set_nbytes(t.nbytes);
      }
    } else if (payload.transport() == TransportKind::kShm) {
      v1::ShmRef* shm = ref->mutable_shm();
      shm->set_segment(payload.shm_name());
      shm->set_offset(t.offset);
      shm->set_nbytes(t.nbytes);
    } else {
      ref->set_inline_data(payload.data() + t.offset, t.nbytes);
    }
  }
}

absl::StatusOr<std::unique_ptr<ReceivedBatch>> ReceivedBatch::Resolve(v1::BatchDescriptor descriptor,
                                                                      const std::string& shm_prefix) {
  auto out = std::unique_ptr<ReceivedBatch>(new ReceivedBatch());
  out->descriptor_ = std::move(descriptor);
  std::map<std::string, ShmSegment*> open;
  for (const v1::TensorRef& ref : out->descriptor_.tensors()) {
    ReceivedTensor t;
    t.name = ref.name();
    auto dtype = FromWire(ref.dtype());
    if (!dtype.ok()) return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": ", dtype.status().message()));
    t.dtype = *dtype;
    uint64_t numel = 1;
    bool zero = false, overflow = false;
    for (int64_t d : ref.shape()) {
      if (d < 0) return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": negative dimension"));
      if (d == 0) zero = true;
      overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
      t.shape.push_back(d);
    }
    uint64_t expect = 0;
    if (!zero && (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(t.dtype)), &expect))) {
      // A wrapped count would let a corrupt shape pass as a small tensor.
      return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": shape too large (over 2^64 bytes)"));
    }
    if (ref.has_shm()) {
      const v1::ShmRef& s = ref.shm();
      if (s.nbytes() != expect) {
        return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": shm says ", s.nbytes(), " bytes, shape needs ", expect));
      }
      if (shm_prefix.empty() || s.segment().compare(0, shm_prefix.size(), shm_prefix) != 0 ||
          s.segment().find('/', 1) != std::string::npos) {
        return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": shm segment \"", s.segment(),
                                                "\" is not one of this teacher's (prefix \"", shm_prefix, "\")"));
      }
      ShmSegment* seg = nullptr;
      auto it = open.find(s.segment());
      if (it != open.end()) {
        seg = it->second;
      } else {
        auto opened = ShmSegment::Open(s.segment(), 0);
        if (!opened.ok()) return opened.status();
        seg = opened->get();
        open[s.segment()] = seg;
        out->segments_.push_back(std::move(opened).value());
      }
      if (s.offset() > seg->size() || s.nbytes() > seg->size() - s.offset()) {
        return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": bytes [", s.offset(), ", +", s.nbytes(),
                                                ") lie outside shm segment ", s.segment(), " of ", seg->size()));
      }
      t.data = seg->data() + s.offset();
      t.nbytes = s.nbytes();
    } else if (ref.location_case() == v1::TensorRef::kInlineData) {
      if (ref.inline_data().size() != expect) {
        return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": ", ref.inline_data().size(),
                                                " inline bytes, shape needs ", expect));
      }
      t.data = reinterpret_cast<const uint8_t*>(ref.inline_data().data());
      t.nbytes = ref.inline_data().size();
    } else if (ref.has_cuda_ipc() || ref.has_nccl()) {
      // Device payloads travel as one block; check each range lies in it.
      const bool ipc = ref.has_cuda_ipc();
      const uint64_t offset = ipc ? ref.cuda_ipc().offset() : ref.nccl().offset();
      const uint64_t nbytes = ipc ? ref.cuda_ipc().nbytes() : ref.nccl().nbytes();
      const uint64_t block = out->descriptor_.payload_bytes();
      if (nbytes != expect) {
        return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": ", ipc ? "CUDA IPC" : "NCCL", " ref says ",
                                                nbytes, " bytes, shape needs ", expect));
      }
      if (offset > block || nbytes > block - offset) {
        return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": bytes [", offset, ", +", nbytes,
                                                ") lie outside the payload of ", block, " bytes"));
      }
      if (ipc) {
        if (!out->ipc_handle_.empty() && out->ipc_handle_ != ref.cuda_ipc().handle()) {
          return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": CUDA IPC handle differs from the batch's"));
        }
        out->ipc_handle_ = ref.cuda_ipc().handle();
        out->ipc_device_ = ref.cuda_ipc().device();
      }
      if (!out->tensors_.empty() && !out->on_device_) {
        return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": mixes device and host transports in one batch"));
      }
      out->on_device_ = true;
      t.offset = offset;
      t.nbytes = nbytes;
    } else {
      return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": no location (inline, shm, CUDA IPC or NCCL)"));
    }
    if (out->on_device_ && t.data != nullptr) {
      return absl::DataLossError(absl::StrCat("tensor ", ref.name(), ": mixes device and host transports in one batch"));
    }
    out->tensors_.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<ReceivedTensor> ReceivedBatch::Get(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  return absl::DataLossError(absl::StrCat("batch ", descriptor_.batch_id(), " has no tensor \"", name, "\""));
}

}  // namespace e3
