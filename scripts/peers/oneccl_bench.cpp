// oneCCL (Intel oneAPI Collective Communications Library, C++ API) CPU allreduce, for `pyxccl bench --vs oneccl`
// (built by scripts/setup_peers.sh oneccl; run by pyxccl/bench/oneccl.py, which turns its lines into table rows).
//
// One binary, self-launching: `bench_oneccl -n 2 --sizes 8,1048576,67108864` fork()s n ranks
// on this host before ccl::init(); rank 0 creates the main KVS and hands its address to the
// other ranks over pipes (no MPI / PMI needed: CCL_PROCESS_LAUNCHER=none with
// CCL_LOCAL_RANK/CCL_LOCAL_SIZE set per rank). Build + run: see run_oneccl.sh.
//
// Method (that of pyxccl.bench.runner.time_case): per size, W warm-up + N timed iterations (5+20 up to
// 1 MiB, 2+10 up to 16 MiB, 1+5 above); the input (pyxccl's pattern i % 7 + rank + 1) is reset untimed
// before every iteration, a ccl::barrier precedes every timed call, the timed call is an in-place
// ccl::allreduce(buf, buf, count, sum, comm).wait(); per-iteration time = max over ranks; the last
// iteration's result is compared exactly with the expected sum. Rank 0 prints one JSON line per size on
// stdout with the per-iteration times and the wrong elements summed over ranks: Python takes the median,
// so every library's figures come out of the same code (pyxccl.bench.methodology.summarize).
#include <oneapi/ccl.hpp>

#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

static size_t parse_size(std::string s)
{
    size_t mult = 1;
    const char* sufs[] = {"KiB", "MiB", "GiB", "K", "M", "G"};
    const size_t mults[] = {1ul << 10, 1ul << 20, 1ul << 30, 1ul << 10, 1ul << 20, 1ul << 30};
    for (int i = 0; i < 6; i++) {
        size_t l = strlen(sufs[i]);
        if (s.size() > l && s.compare(s.size() - l, l, sufs[i]) == 0) {
            s = s.substr(0, s.size() - l);
            mult = mults[i];
            break;
        }
    }
    return std::stoull(s) * mult;
}

static void schedule(size_t size, int& warm, int& iters)
{
    if (size <= (1ul << 20)) { warm = 5; iters = 20; }
    else if (size <= (16ul << 20)) { warm = 2; iters = 10; }
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

static int run_rank(int rank, int world, int addr_fd_in, const std::vector<int>& addr_fds_out,
                    const std::vector<size_t>& sizes, const std::string& kvs_file)
{
    const bool external = !kvs_file.empty();  // launched by mpiexec (hydra): rank/size from PMI_*
    if (!external) {
        setenv("CCL_PROCESS_LAUNCHER", "none", 1);
        setenv("CCL_LOCAL_RANK", std::to_string(rank).c_str(), 1);
        setenv("CCL_LOCAL_SIZE", std::to_string(world).c_str(), 1);
    }
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
        if (external) {
            std::string tmp = kvs_file + ".tmp";
            int fd = open(tmp.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
            if (fd < 0) { perror("open kvs file"); exit(3); }
            write_all(fd, addr.data(), addr.size());
            close(fd);
            rename(tmp.c_str(), kvs_file.c_str());
        }
        for (int fd : addr_fds_out) { write_all(fd, addr.data(), addr.size()); close(fd); }
    } else {
        if (external) {
            int fd = -1;
            for (int tries = 0; fd < 0 && tries < 120000; tries++) {
                fd = open(kvs_file.c_str(), O_RDONLY);
                if (fd < 0) usleep(1000);
            }
            if (fd < 0) { fprintf(stderr, "rank %d: no KVS address in %s\n", rank, kvs_file.c_str()); exit(3); }
            read_all(fd, addr.data(), addr.size());
            close(fd);
        } else {
            read_all(addr_fd_in, addr.data(), addr.size());
            close(addr_fd_in);
        }
        kvs = ccl::create_kvs(addr);
    }
    auto comm = ccl::create_communicator(world, rank, kvs);
    if (comm.rank() != rank || comm.size() != world) {
        fprintf(stderr, "rank mismatch %d/%d vs %d/%d\n", comm.rank(), comm.size(), rank, world);
        return 4;
    }

    if (rank == 0) {
        auto v = ccl::get_library_version();
        const char* keys[] = {"CCL_PROCESS_LAUNCHER", "I_MPI_FABRICS", "CCL_ATL_TRANSPORT", "CCL_ATL_SHM", "FI_PROVIDER", "CCL_WORKER_COUNT",
                              "CCL_WORKER_AFFINITY", "CCL_WORKER_OFFLOAD", "CCL_WORKER_WAIT", "CCL_ALLREDUCE",
                              "OMP_NUM_THREADS"};
        fprintf(stderr, "{\"kind\": \"meta\", \"lib\": \"oneccl\", \"ccl_version\": \"%d.%d.%d %s\", \"world_size\": %d",
                v.major, v.minor, v.update, v.full, world);
        for (auto k : keys) {
            const char* e = getenv(k);
            if (e) fprintf(stderr, ", \"%s\": \"%s\"", k, e); else fprintf(stderr, ", \"%s\": null", k);
        }
        fprintf(stderr, "}\n");
    }

    const float tri = float(world * (world + 1) / 2);
    for (size_t size : sizes) {
        size_t n = size / 4;
        std::vector<float> src(n), expected(n), x(n);
        for (size_t i = 0; i < n; i++) {
            float p = float(i % 7);
            src[i] = p + float(rank + 1);
            expected[i] = float(world) * p + tri;
        }
        int warm, iters;
        schedule(size, warm, iters);
        std::vector<double> times;
        for (int it = 0; it < warm + iters; it++) {
            memcpy(x.data(), src.data(), size);
            ccl::barrier(comm).wait();
            auto t0 = std::chrono::steady_clock::now();
            ccl::allreduce(x.data(), x.data(), n, ccl::reduction::sum, comm).wait();
            auto t1 = std::chrono::steady_clock::now();
            if (it >= warm) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
        int64_t wrong = 0;
        for (size_t i = 0; i < n; i++) wrong += x[i] != expected[i];
        std::vector<double> tmax(times.size());
        ccl::allreduce(times.data(), tmax.data(), times.size(), ccl::reduction::max, comm).wait();
        int64_t wrong_all = 0;
        ccl::allreduce(&wrong, &wrong_all, 1, ccl::reduction::sum, comm).wait();
        if (rank == 0) {
            fprintf(json_out, "{\"lib\": \"oneccl\", \"op\": \"allreduce\", \"type\": \"float32\", \"n\": %d, "
                    "\"size\": %zu, \"count\": %zu, \"wrong\": %lld, \"warmup\": %d, \"times_us\": [",
                    world, size, n, (long long)wrong_all, warm);
            for (size_t i = 0; i < tmax.size(); i++) fprintf(json_out, "%s%.3f", i ? ", " : "", tmax[i]);
            fprintf(json_out, "]}\n");
            fflush(json_out);
        }
    }
    ccl::barrier(comm).wait();
    if (external && rank == 0) unlink(kvs_file.c_str());
    return 0;
}

int main(int argc, char** argv)
{
    int world = 2;
    std::string sizes_s = "8,1048576,67108864";
    std::string kvs_file;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if ((a == "-n" || a == "--nproc") && i + 1 < argc) world = atoi(argv[++i]);
        else if (a == "--sizes" && i + 1 < argc) sizes_s = argv[++i];
        else if (a.rfind("--sizes=", 0) == 0) sizes_s = a.substr(8);
        else if (a == "--kvs-file" && i + 1 < argc) kvs_file = argv[++i];
        else {
            fprintf(stderr, "usage: %s [-n NPROC] [--sizes B1,B2,...]   (self-launch NPROC ranks, ofi transport)\n"
                            "       mpiexec -n NPROC %s --kvs-file UNIQUE_PATH [--sizes ...]   (ranks from PMI_RANK/PMI_SIZE)\n",
                    argv[0], argv[0]);
            return 1;
        }
    }
    std::vector<size_t> sizes;
    std::stringstream ss(sizes_s);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
        if (tok.empty()) continue;
        size_t s = parse_size(tok);
        if (s == 0 || s % 4) { fprintf(stderr, "size %zu not a positive multiple of 4\n", s); return 1; }
        sizes.push_back(s);
    }
    if (world < 1) return 1;

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
    if (!kvs_file.empty()) {
        const char* r = getenv("PMI_RANK");
        const char* n = getenv("PMI_SIZE");
        if (!r || !n) { fprintf(stderr, "--kvs-file needs PMI_RANK/PMI_SIZE (launch with mpiexec)\n"); return 1; }
        my_rank = atoi(r);
        world = atoi(n);
    }
    for (int r = 1; kvs_file.empty() && r < world; r++) {
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
        rc = run_rank(my_rank, world, my_in, to_child_w, sizes, kvs_file);
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
