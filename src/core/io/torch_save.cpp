#include "core/io/torch_save.h"

#include "core/io/archive.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <map>
#include <memory>

namespace slipstream {
namespace {

const std::vector<std::pair<const char*, at::ScalarType>>& storage_types() {
  static const std::vector<std::pair<const char*, at::ScalarType>> all = {
      {"FloatStorage", at::kFloat}, {"DoubleStorage", at::kDouble},
      {"HalfStorage", at::kHalf},   {"BFloat16Storage", at::kBFloat16},
      {"LongStorage", at::kLong},   {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort}, {"CharStorage", at::kChar},
      {"ByteStorage", at::kByte},   {"BoolStorage", at::kBool}};
  return all;
}

// A pickle value: only what a state dict holds.
struct Value {
  enum Kind { kNone, kBool, kInt, kFloat, kStr, kTuple, kList, kDict, kGlobal, kStorage, kTensor };
  Kind kind = kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;  // kStr; kGlobal "module.name"; kStorage: the key
  std::vector<std::shared_ptr<Value>> items;
  std::vector<std::pair<std::shared_ptr<Value>, std::shared_ptr<Value>>> dict;
  at::ScalarType dtype = at::kFloat;  // kStorage
  at::Tensor tensor;                  // kStorage (its elements), kTensor

  Value() = default;
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;
  // Frees nested containers one at a time rather than by recursion, so that
  // a pickle of a million nested tuples cannot overflow the stack.
  ~Value() {
    std::vector<std::shared_ptr<Value>> pending;
    const auto take_children = [&pending](Value& v) {
      for (auto& c : v.items) pending.push_back(std::move(c));
      for (auto& [k, c] : v.dict) {
        pending.push_back(std::move(k));
        pending.push_back(std::move(c));
      }
      v.items.clear();
      v.dict.clear();
    };
    take_children(*this);
    while (!pending.empty()) {
      std::shared_ptr<Value> c = std::move(pending.back());
      pending.pop_back();
      if (c && c.use_count() == 1) take_children(*c);
    }
  }
};
using V = std::shared_ptr<Value>;

V make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

class Unpickler {
 public:
  Unpickler(const std::string& pkl, const std::map<std::string, std::string>& entries,
            std::string prefix, std::string what)
      : p_(pkl), entries_(entries), prefix_(std::move(prefix)), what_(std::move(what)) {}

  V run() {
    for (;;) {
      const auto op = static_cast<unsigned char>(byte());
      switch (op) {
        case 0x80:
          byte();
          break;  // PROTO
        case 0x95:
          take(8);
          break;  // FRAME
        case '(':
          marks_.push_back(stack_.size());
          break;
        case '.':
          return pop();
        case 'N':
          push(make(Value::kNone));
          break;
        case 0x88:
        case 0x89: {
          auto v = make(Value::kBool);
          v->i = op == 0x88;
          push(v);
          break;
        }
        case 'K':
          push_int(static_cast<unsigned char>(byte()));
          break;
        case 'M':
          push_int(static_cast<int64_t>(uint_le(2)));
          break;
        case 'J':
          push_int(static_cast<int32_t>(uint_le(4)));
          break;
        case 0x8a: {  // LONG1
          const int n = static_cast<unsigned char>(byte());
          check(n <= 8, "an integer wider than 64 bits");
          uint64_t u = uint_le(n);
          if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1) u |= ~uint64_t{0} << (8 * n);
          push_int(static_cast<int64_t>(u));
          break;
        }
        case 'G': {
          uint64_t u = 0;
          for (int k = 0; k < 8; ++k) u = (u << 8) | static_cast<unsigned char>(byte());
          auto v = make(Value::kFloat);
          std::memcpy(&v->f, &u, 8);
          push(v);
          break;
        }
        case 'X':
          push_str(take(uint_le(4)));
          break;
        case 0x8c:
          push_str(take(static_cast<unsigned char>(byte())));
          break;
        case 'c': {
          auto v = make(Value::kGlobal);
          const std::string module = line();
          v->s = module + "." + line();
          push(v);
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const V name = pop(), module = pop();
          auto v = make(Value::kGlobal);
          v->s = module->s + "." + name->s;
          push(v);
          break;
        }
        case 'q':
          memo_[static_cast<unsigned char>(byte())] = top();
          break;
        case 'r':
          memo_[uint_le(4)] = top();
          break;
        case 0x94:
          memo_[memo_.size()] = top();
          break;  // MEMOIZE
        case 'h':
          push(memo(static_cast<unsigned char>(byte())));
          break;
        case 'j':
          push(memo(uint_le(4)));
          break;
        case ')':
          push(make(Value::kTuple));
          break;
        case ']':
          push(make(Value::kList));
          break;
        case '}':
          push(make(Value::kDict));
          break;
        case 't': {
          auto v = make(Value::kTuple);
          v->items = pop_to_mark();
          push(v);
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
          auto v = make(Value::kTuple);
          v->items.resize(op - 0x84);
          for (size_t k = v->items.size(); k-- > 0;) v->items[k] = pop();
          push(v);
          break;
        }
        case 'a': {
          const V x = pop();
          expect(top(), Value::kList, "APPEND")->items.push_back(x);
          break;
        }
        case 'e': {
          auto xs = pop_to_mark();
          auto& list = expect(top(), Value::kList, "APPENDS")->items;
          list.insert(list.end(), xs.begin(), xs.end());
          break;
        }
        case 's': {
          const V value = pop(), key = pop();
          expect(top(), Value::kDict, "SETITEM")->dict.emplace_back(key, value);
          break;
        }
        case 'u': {
          auto xs = pop_to_mark();
          check(xs.size() % 2 == 0, "SETITEMS with an odd number of values");
          auto& d = expect(top(), Value::kDict, "SETITEMS")->dict;
          for (size_t k = 0; k < xs.size(); k += 2) d.emplace_back(xs[k], xs[k + 1]);
          break;
        }
        case 'Q':
          push(storage(pop()));
          break;
        case 'R': {
          const V args = pop(), callable = pop();
          push(reduce(expect(callable, Value::kGlobal, "REDUCE")->s, *args));
          break;
        }
        case 'b': {  // BUILD: an OrderedDict's state is its _metadata; dropped
          pop();
          expect(top(), Value::kDict, "BUILD");
          break;
        }
        default:
          check(false, "pickle opcode 0x" + hex(op) + " at byte " + std::to_string(at_ - 1) +
                           ", which a state dict does not use");
      }
    }
  }

 private:
  void check(bool ok, const std::string& why) const {
    TORCH_CHECK(ok, "'", what_, "': not a state dict torch.save wrote: ", why);
  }
  static std::string hex(unsigned v) {
    const char* d = "0123456789abcdef";
    return std::string{d[(v >> 4) & 15], d[v & 15]};
  }
  char byte() {
    check(at_ < p_.size(), "data.pkl ends before its STOP opcode");
    return p_[at_++];
  }
  std::string take(uint64_t n) {
    check(at_ + n <= p_.size(), "data.pkl is truncated");
    std::string s = p_.substr(at_, n);
    at_ += n;
    return s;
  }
  uint64_t uint_le(int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= uint64_t{static_cast<unsigned char>(byte())} << (8 * k);
    return v;
  }
  std::string line() {
    const size_t end = p_.find('\n', at_);
    check(end != std::string::npos, "an unterminated GLOBAL");
    std::string s = p_.substr(at_, end - at_);
    at_ = end + 1;
    return s;
  }
  void push(V v) { stack_.push_back(std::move(v)); }
  void push_int(int64_t i) {
    auto v = make(Value::kInt);
    v->i = i;
    push(v);
  }
  void push_str(std::string s) {
    auto v = make(Value::kStr);
    v->s = std::move(s);
    push(v);
  }
  V pop() {
    check(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()),
          "the pickle stack underflows");
    V v = stack_.back();
    stack_.pop_back();
    return v;
  }
  const V& top() const {
    check(!stack_.empty(), "the pickle stack underflows");
    return stack_.back();
  }
  std::vector<V> pop_to_mark() {
    check(!marks_.empty(), "no MARK");
    std::vector<V> xs(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return xs;
  }
  V memo(uint64_t key) const {
    auto it = memo_.find(key);
    check(it != memo_.end(), "a memo key that was never put");
    return it->second;
  }
  const V& expect(const V& v, Value::Kind kind, const char* op) const {
    check(v->kind == kind, std::string(op) + " on the wrong kind of value");
    return v;
  }
  int64_t int_of(const V& v, const char* what) const {
    check(v->kind == Value::kInt, std::string(what) + " is not an integer");
    return v->i;
  }
  std::vector<int64_t> ints_of(const V& v, const char* what) const {
    check(v->kind == Value::kTuple, std::string(what) + " is not a tuple");
    std::vector<int64_t> out;
    for (const auto& x : v->items) out.push_back(int_of(x, what));
    return out;
  }

  // ('storage', torch.<Type>Storage, key, location, numel) -> the storage.
  V storage(const V& pid) {
    check(pid->kind == Value::kTuple && pid->items.size() == 5 &&
              pid->items[0]->kind == Value::kStr && pid->items[0]->s == "storage" &&
              pid->items[1]->kind == Value::kGlobal && pid->items[2]->kind == Value::kStr,
          "a persistent id that is not a storage");
    const std::string& type = pid->items[1]->s;
    const std::string& key = pid->items[2]->s;
    if (auto it = storages_.find(key); it != storages_.end()) return it->second;
    auto v = make(Value::kStorage);
    v->s = key;
    bool known = false;
    for (const auto& [name, dtype] : storage_types()) {
      if (type == std::string("torch.") + name) v->dtype = dtype, known = true;
    }
    check(known, "storage type '" + type + "' is not supported");
    const int64_t numel = int_of(pid->items[4], "a storage's size");
    const std::string entry = prefix_ + "data/" + key;
    auto it = entries_.find(entry);
    TORCH_CHECK(it != entries_.end(), "'", what_, "': storage '", key, "' has no entry '", entry,
                "'");
    const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(v->dtype));
    TORCH_CHECK(static_cast<int64_t>(it->second.size()) == bytes, "'", what_, "': storage '", key,
                "' holds ", it->second.size(), " bytes, its ", numel, " elements need ", bytes);
    v->tensor = at::empty({numel}, at::TensorOptions().dtype(v->dtype));
    if (bytes > 0) std::memcpy(v->tensor.data_ptr(), it->second.data(), bytes);
    storages_[key] = v;
    return v;
  }

  V reduce(const std::string& callable, const Value& args) {
    if (callable == "collections.OrderedDict") {
      check(args.kind == Value::kTuple && args.items.empty(), "OrderedDict with arguments");
      return make(Value::kDict);
    }
    if (callable == "torch._utils._rebuild_tensor_v2") {
      check(args.kind == Value::kTuple && args.items.size() >= 4 &&
                args.items[0]->kind == Value::kStorage,
            "_rebuild_tensor_v2 without (storage, offset, size, stride)");
      const at::Tensor& s = args.items[0]->tensor;
      const int64_t offset = int_of(args.items[1], "a tensor's storage offset");
      const auto size = ints_of(args.items[2], "a tensor's size");
      const auto stride = ints_of(args.items[3], "a tensor's stride");
      check(size.size() == stride.size(), "a tensor whose size and stride differ in rank");
      check(offset >= 0, "a negative storage offset");
      // The last element addressed and the element count, both bounded by
      // the storage: a tensor may not hold more elements than its storage
      // (zero or overlapping strides would make a few stored bytes a tensor
      // of any size once copied).
      int64_t last = offset, numel = 1;
      for (size_t d = 0; d < size.size(); ++d) {
        check(size[d] >= 0 && stride[d] >= 0, "a negative size or stride");
        if (size[d] == 0) last = -1;
        int64_t reach = 0;
        check(!__builtin_mul_overflow(size[d], numel, &numel) &&
                  (last < 0 || (!__builtin_mul_overflow(size[d] - 1, stride[d], &reach) &&
                                !__builtin_add_overflow(last, reach, &last))),
              "a tensor whose size overflows 64 bits");
      }
      TORCH_CHECK(last < s.numel(), "'", what_, "': a tensor reaches element ", last,
                  " of its storage '", args.items[0]->s, "', which holds ", s.numel());
      TORCH_CHECK(numel <= s.numel(), "'", what_, "': a tensor of ", numel,
                  " elements over its storage '", args.items[0]->s, "' of ", s.numel(),
                  " (repeated elements are not read)");
      auto v = make(Value::kTensor);
      v->tensor = s.as_strided(size, stride, offset).clone();
      return v;
    }
    if (callable == "torch._utils._rebuild_parameter") {
      check(args.kind == Value::kTuple && !args.items.empty() &&
                args.items[0]->kind == Value::kTensor,
            "_rebuild_parameter without a tensor");
      return args.items[0];
    }
    check(false, "it calls '" + callable + "', which is not read (only tensors and dicts)");
    return nullptr;
  }

  const std::string& p_;
  const std::map<std::string, std::string>& entries_;
  std::string prefix_, what_;
  size_t at_ = 0;
  std::vector<V> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, V> memo_;
  std::map<std::string, V> storages_;
};

void put_int(std::string& out, int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    out += 'J';
    const auto u = static_cast<uint32_t>(static_cast<int32_t>(v));
    for (int k = 0; k < 4; ++k) out += static_cast<char>((u >> (8 * k)) & 0xff);
  } else {
    out += '\x8a';
    out += '\x08';
    const auto u = static_cast<uint64_t>(v);
    for (int k = 0; k < 8; ++k) out += static_cast<char>((u >> (8 * k)) & 0xff);
  }
}

void put_str(std::string& out, const std::string& s) {
  out += 'X';
  const auto n = static_cast<uint32_t>(s.size());
  for (int k = 0; k < 4; ++k) out += static_cast<char>((n >> (8 * k)) & 0xff);
  out += s;
}

void put_ints(std::string& out, at::IntArrayRef xs) {
  out += '(';
  for (const int64_t x : xs) put_int(out, x);
  out += 't';
}

}  // namespace

NamedTensors read_torch_state_dict(const std::string& bytes, const std::string& what) {
  const auto entries = read_archive(bytes, what);
  std::string pkl_name;
  for (const auto& [name, data] : entries) {
    const std::string suffix = "data.pkl";
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      TORCH_CHECK(pkl_name.empty(), "'", what, "': two data.pkl entries ('", pkl_name, "', '", name,
                  "')");
      pkl_name = name;
    }
  }
  TORCH_CHECK(!pkl_name.empty(), "'", what, "': no data.pkl: not a file torch.save wrote");
  const std::string prefix = pkl_name.substr(0, pkl_name.size() - 8);
  if (auto it = entries.find(prefix + "byteorder"); it != entries.end()) {
    TORCH_CHECK(it->second.rfind("little", 0) == 0, "'", what, "': byte order '", it->second,
                "' (only little-endian files are read)");
  }
  Unpickler unpickler(entries.at(pkl_name), entries, prefix, what);
  const auto root = unpickler.run();
  TORCH_CHECK(root && root->kind == Value::kDict, "'", what,
              "': the pickled object is not a dict of tensors");
  NamedTensors out;
  for (const auto& [k, v] : root->dict) {
    TORCH_CHECK(k->kind == Value::kStr, "'", what, "': a state-dict key that is not a string");
    TORCH_CHECK(v->kind == Value::kTensor, "'", what, "': '", k->s, "' is not a tensor");
    out.emplace_back(k->s, v->tensor);
  }
  return out;
}

std::string write_torch_state_dict(const NamedTensors& tensors, const std::string& archive) {
  std::string pkl = "\x80\x02";
  pkl += "ccollections\nOrderedDict\n)R(";
  std::vector<std::pair<std::string, std::string>> entries;
  entries.emplace_back(archive + "/data.pkl", "");  // filled in below
  entries.emplace_back(archive + "/byteorder", "little");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t_in] = tensors[i];
    const at::Tensor t = t_in.detach().to(at::kCPU).contiguous();
    const char* type = nullptr;
    for (const auto& [storage, dtype] : storage_types()) {
      if (t.scalar_type() == dtype) type = storage;
    }
    TORCH_CHECK(type != nullptr, "torch.save: '", name, "' has dtype ", t.scalar_type(),
                ", which is not written");
    const std::string key = std::to_string(i);
    put_str(pkl, name);
    pkl += "ctorch._utils\n_rebuild_tensor_v2\n((";
    put_str(pkl, "storage");
    pkl += std::string("ctorch\n") + type + "\n";
    put_str(pkl, key);
    put_str(pkl, "cpu");
    put_int(pkl, t.numel());
    pkl += "tQ";
    put_int(pkl, 0);
    put_ints(pkl, t.sizes());
    put_ints(pkl, t.strides());
    pkl += "\x89";
    pkl += "ccollections\nOrderedDict\n)Rt";
    pkl += "R";
    entries.emplace_back(std::string(archive).append("/data/").append(key),
                         std::string(static_cast<const char*>(t.data_ptr()),
                                     static_cast<size_t>(t.numel()) * t.element_size()));
  }
  pkl += "u.";
  entries[0].second = std::move(pkl);
  entries.emplace_back(archive + "/version", "3\n");
  return write_zip(entries, 64);
}

}  // namespace slipstream
