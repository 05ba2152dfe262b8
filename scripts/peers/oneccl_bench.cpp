// oneCCL (Intel oneAPI Collective Communications Library, C++ API) on CPU, for `pyxccl bench --vs oneccl`:
// built by scripts/setup_peers.sh oneccl, run by src/pyxccl/bench/oneccl.py, which turns its lines into rows.
// (From ../shared/peers/more/bench_oneccl.cpp, the recipe these numbers were first measured with.)
//
//     oneccl_bench -n NPROC --cases PRIM:TOTAL:PER,...      e.g. --cases allreduce:2:2,allgather:262144:131072
//
// PRIM is allreduce, broadcast, reduce, allgather, reduce_scatter or alltoall (oneCCL has no gather/scatter);
// TOTAL and PER are element counts (float32) as pyxccl.bench.methodology.counts gives them, so no rule of
// sizes is written twice. The binary fork()s its NPROC ranks before ccl::init(); rank 0 creates the main KVS
// and hands its address to the others over pipes (no MPI / PMI: CCL_PROCESS_LAUNCHER=none with
// CCL_LOCAL_RANK / CCL_LOCAL_SIZE set per rank).
//
// Method (that of pyxccl.bench.runner.time_case, buffers and expected results of runner.Case): per case,
// W warm-up + N timed iterations (5+20 up to 1 MiB, 2+10 up to 16 MiB, 1+5 above); the inputs are reset
// untimed before every iteration, a ccl::barrier precedes every timed call; per-iteration time = max over
// ranks; the last iteration's result is compared exactly with the expected one. Rank 0 prints one JSON line
// per case on stdout with the per-iteration times and the wrong elements summed over ranks: Python takes
// the median, so every library's figures come out of the same code (methodology.summarize).
#include <oneapi/ccl.hpp>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

struct Case {
    std::string prim;
    size_t total, per;  // elements: the full buffer, and one rank's block of the split primitives
};

static void schedule(size_t bytes, int& warm, int& iters)
{
    if (bytes <= (1ul << 20)) { warm = 5; iters = 20; }
    else if (bytes <= (16ul << 20)) { warm = 2; iters = 10; }
    else { warm = 1; iters = 5; }
}

static void write_all(int fd, const void* p, size_t n)
{
    const char* c = (const char*)p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) { perror("write"); exit(3); }
        c += w; n -= w;
    }
}

static void read_all(int fd, void* p, size_t n)
{
    char* c = (char*)p;
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r <= 0) { perror("read"); exit(3); }
        c += r; n -= r;
    }
}

static FILE* json_out = stdout;

// One rank's buffers of a case, as runner.Case makes them (pattern p(i) = i % 7, root 0).
struct Buffers {
    std::vector<float> ref, send, recv, expect;  // expect empty: nothing to check on this rank
    bool inplace;
};

static Buffers buffers(const Case& c, int rank, int n)
{
    auto p = [](size_t i) { return float(i % 7); };
    const float tri = float(n * (n + 1) / 2);
    Buffers b;
    b.inplace = c.prim == "allreduce" || c.prim == "broadcast";
    size_t in = c.total, out = c.total;
    if (c.prim == "allgather") in = c.per;
    if (c.prim == "reduce_scatter") out = c.per;
    b.ref.resize(in);
    for (size_t i = 0; i < in; i++) {
        if (c.prim == "broadcast") b.ref[i] = rank == 0 ? p(i) + 1 : 0;
        else if (c.prim == "alltoall") b.ref[i] = p(i % c.per) + 3 * rank + float(i / c.per);
        else b.ref[i] = p(i) + float(rank + 1);
    }
    if (c.prim != "reduce" || rank == 0) {
        b.expect.resize(out);
        for (size_t i = 0; i < out; i++) {
            if (c.prim == "allreduce" || c.prim == "reduce") b.expect[i] = float(n) * p(i) + tri;
            else if (c.prim == "broadcast") b.expect[i] = p(i) + 1;
            else if (c.prim == "allgather") b.expect[i] = p(i % c.per) + float(i / c.per + 1);
            else if (c.prim == "reduce_scatter") b.expect[i] = float(n) * p(rank * c.per + i) + tri;
            else if (c.prim == "alltoall") b.expect[i] = p(i % c.per) + 3 * float(i / c.per) + float(rank);
        }
    }
    b.send.resize(in);
    if (!b.inplace) b.recv.resize(out);
    return b;
}

static void call(const Case& c, Buffers& b, const ccl::communicator& comm)
{
    float* s = b.send.data();
    float* r = b.inplace ? s : b.recv.data();
    const auto sum = ccl::reduction::sum;
    if (c.prim == "allreduce") ccl::allreduce(s, r, c.total, sum, comm).wait();
    else if (c.prim == "broadcast") ccl::broadcast(s, c.total, 0, comm).wait();
    else if (c.prim == "reduce") ccl::reduce(s, r, c.total, sum, 0, comm).wait();
    else if (c.prim == "allgather") ccl::allgather(s, r, c.per, comm).wait();
    else if (c.prim == "reduce_scatter") ccl::reduce_scatter(s, r, c.per, sum, comm).wait();
    else if (c.prim == "alltoall") ccl::alltoall(s, r, c.per, comm).wait();
}

static int run_rank(int rank, int world, int addr_fd_in, const std::vector<int>& addr_fds_out,
                    const std::vector<Case>& cases)
{
    setenv("CCL_PROCESS_LAUNCHER", "none", 1);
    setenv("CCL_LOCAL_RANK", std::to_string(rank).c_str(), 1);
    setenv("CCL_LOCAL_SIZE", std::to_string(world).c_str(), 1);
    setenv("CCL_KVS_IFACE", "lo", 0);  // KVS bootstrap socket on loopback only
    setenv("FI_TCP_IFACE", "lo", 0);    // in case the ofi tcp provider is chosen
    setenv("FI_SOCKETS_IFACE", "lo", 0);
    // Defaults chosen for a single small host (each can be overridden from the environment):
    // libfabric shm provider (otherwise oneCCL picks a network provider, e.g. "net" on eth0),
    // which oneCCL only accepts together with CCL_ATL_SHM=1; and no worker-thread offload:
    // with the default CCL_WORKER_OFFLOAD=1 every rank has a busy-polling worker thread besides
    // the polling user thread, which on 2 cores turns an 8-byte allreduce into ~10-50 ms.
    setenv("CCL_ATL_TRANSPORT", "ofi", 0);
    setenv("CCL_ATL_SHM", "1", 0);
    setenv("FI_PROVIDER", "shm", 0);
    setenv("CCL_WORKER_OFFLOAD", "0", 0);

    ccl::init();
    ccl::shared_ptr_class<ccl::kvs> kvs;
    ccl::kvs::address_type addr;
    if (rank == 0) {
        kvs = ccl::create_main_kvs();
        addr = kvs->get_address();
        for (int fd : addr_fds_out) { write_all(fd, addr.data(), addr.size()); close(fd); }
    } else {
        read_all(addr_fd_in, addr.data(), addr.size());
        close(addr_fd_in);
        kvs = ccl::create_kvs(addr);
    }
    auto comm = ccl::create_communicator(world, rank, kvs);
    if (comm.rank() != rank || comm.size() != world) {
        fprintf(stderr, "rank mismatch %d/%d vs %d/%d\n", comm.rank(), comm.size(), rank, world);
        return 4;
    }

    if (rank == 0) {
        auto v = ccl::get_library_version();
        const char* keys[] = {"CCL_ATL_TRANSPORT", "CCL_ATL_SHM", "FI_PROVIDER", "CCL_WORKER_COUNT",
                              "CCL_WORKER_AFFINITY", "CCL_WORKER_OFFLOAD", "CCL_WORKER_WAIT", "CCL_ALLREDUCE"};
        fprintf(stderr, "{\"kind\": \"meta\", \"lib\": \"oneccl\", \"ccl_version\": \"%d.%d.%d %s\", \"world_size\": %d",
                v.major, v.minor, v.update, v.full, world);
        for (auto k : keys) {
            const char* e = getenv(k);
            if (e) fprintf(stderr, ", \"%s\": \"%s\"", k, e); else fprintf(stderr, ", \"%s\": null", k);
        }
        fprintf(stderr, "}\n");
    }

    for (const Case& c : cases) {
        Buffers b = buffers(c, rank, world);
        int warm, iters;
        schedule(c.total * sizeof(float), warm, iters);
        std::vector<double> times;
        for (int it = 0; it < warm + iters; it++) {
            b.send = b.ref;
            std::fill(b.recv.begin(), b.recv.end(), 0.0f);
            ccl::barrier(comm).wait();
            auto t0 = std::chrono::steady_clock::now();
            call(c, b, comm);
            auto t1 = std::chrono::steady_clock::now();
            if (it >= warm) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
        const std::vector<float>& got = b.inplace ? b.send : b.recv;
        int64_t wrong = 0;
        for (size_t i = 0; i < b.expect.size(); i++) wrong += got[i] != b.expect[i];
        std::vector<double> tmax(times.size());
        ccl::allreduce(times.data(), tmax.data(), times.size(), ccl::reduction::max, comm).wait();
        int64_t wrong_all = 0;
        ccl::allreduce(&wrong, &wrong_all, 1, ccl::reduction::sum, comm).wait();
        if (rank == 0) {
            fprintf(json_out, "{\"lib\": \"oneccl\", \"op\": \"%s\", \"type\": \"float32\", \"n\": %d, "
                    "\"size\": %zu, \"count\": %zu, \"wrong\": %lld, \"warmup\": %d, \"times_us\": [",
                    c.prim.c_str(), world, c.total * sizeof(float), c.total, (long long)wrong_all, warm);
            for (size_t i = 0; i < tmax.size(); i++) fprintf(json_out, "%s%.3f", i ? ", " : "", tmax[i]);
            fprintf(json_out, "]}\n");
            fflush(json_out);
        }
    }
    ccl::barrier(comm).wait();
    return 0;
}

static const char* PRIMS[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"};

int main(int argc, char** argv)
{
    int world = 2;
    std::string cases_s;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if ((a == "-n" || a == "--nproc") && i + 1 < argc) world = atoi(argv[++i]);
        else if (a == "--cases" && i + 1 < argc) cases_s = argv[++i];
        else world = 0;  // unknown argument: usage below
    }
    std::vector<Case> cases;
    std::stringstream ss(cases_s);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
        Case c;
        char prim[32];
        if (sscanf(tok.c_str(), "%31[a-z_]:%zu:%zu", prim, &c.total, &c.per) != 3) { cases.clear(); break; }
        c.prim = prim;
        bool known = false;
        for (auto p : PRIMS) known |= c.prim == p;
        if (!known || c.total == 0 || c.per == 0) { cases.clear(); break; }
        cases.push_back(c);
    }
    if (world < 1 || cases.empty()) {
        fprintf(stderr, "usage: %s -n NPROC --cases PRIM:TOTAL:PER,...   (element counts of float32; PRIM one of "
                        "allreduce broadcast reduce allgather reduce_scatter alltoall)\n", argv[0]);
        return 1;
    }

    // oneCCL writes its CCL_WARN/CCL_INFO lines to stdout: keep stdout for the JSON lines only.
    fflush(stdout);
    int json_fd = dup(1);
    dup2(2, 1);
    json_out = fdopen(json_fd, "w");
    if (!json_out) { perror("fdopen"); return 3; }

    // fork the ranks before any library initialization (no threads yet)
    std::vector<int> to_child_w;  // rank 0 writes the KVS address into these
    std::vector<pid_t> pids;
    int my_rank = 0, my_in = -1;
    for (int r = 1; r < world; r++) {
        int fds[2];
        if (pipe(fds)) { perror("pipe"); return 3; }
        fflush(stdout); fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 3; }
        if (pid == 0) {
            close(fds[1]);
            for (int fd : to_child_w) close(fd);
            my_rank = r; my_in = fds[0];
            to_child_w.clear();
            pids.clear();
            break;
        }
        close(fds[0]);
        to_child_w.push_back(fds[1]);
        pids.push_back(pid);
    }
    int rc = 0;
    try {
        rc = run_rank(my_rank, world, my_in, to_child_w, cases);
    } catch (const std::exception& e) {
        fprintf(stderr, "[rank %d] exception: %s\n", my_rank, e.what());
        rc = 5;
    }
    if (my_rank != 0) return rc;
    for (pid_t p : pids) {
        int st = 0;
        waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "rank process %d failed (status %d)\n", (int)p, st);
            rc = rc ? rc : 6;
        }
    }
    return rc;
}
