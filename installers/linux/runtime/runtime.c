/* GPUFlex's AppImage runtime: the ELF a type-2 AppImage starts with.
 *
 * Written from the AppImage specification (github.com/AppImage/AppImageSpec, type 2) against
 * Debian's libsquashfuse, because the official runtime is only published on GitHub. Layout:
 *
 *   [this ELF, with "AI\x02" at byte 8][squashfs image of the AppDir]
 *
 * The squashfs starts where the ELF ends, which the ELF header gives us: the section header
 * table is the last thing the linker writes, so end = e_shoff + e_shnum * e_shentsize.
 *
 *   ./App.AppImage ARGS                      mount the image with FUSE, run AppRun ARGS, unmount
 *   ./App.AppImage --appimage-extract [GLOB] extract (the entries matching GLOB) to ./squashfs-root
 *   ./App.AppImage --appimage-extract-and-run ARGS   extract to a temp folder, run, delete it
 *   ./App.AppImage --appimage-offset | --appimage-version | --appimage-help
 *
 * APPIMAGE_EXTRACT_AND_RUN=1 in the environment makes a plain start extract-and-run, as the
 * spec's runtimes do, for hosts without FUSE.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#undef _POSIX_C_SOURCE /* squashfuse's config.h sets its own; glibc's features are fixed above */
#include <squashfuse/ll.h>
#if FUSE_USE_VERSION < 30 /* the session calls below are libfuse 3's */
#error "needs a libsquashfuse built against FUSE 3 (libfuse3), as Debian 12's is"
#endif

#define RUNTIME_VERSION "gpuflex-appimage-runtime 1 (AppImage type 2)"

/* ---- where the image is --------------------------------------------------------------- */

/* The byte just past our own ELF: where the appended squashfs image starts. */
static off_t elf_end(const char *path) {
    Elf64_Ehdr h;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = pread(fd, &h, sizeof h, 0);
    close(fd);
    if (n != (ssize_t)sizeof h || memcmp(h.e_ident, ELFMAG, SELFMAG) != 0 ||
        h.e_ident[EI_CLASS] != ELFCLASS64) /* this runtime is only built for 64-bit targets */
        return -1;
    return (off_t)(h.e_shoff + (Elf64_Off)h.e_shnum * h.e_shentsize);
}

/* ---- extraction ----------------------------------------------------------------------- */

/* A path from the image is written only if it stays inside the target: relative, and no
 * empty, "." or ".." component (a crafted image can put '/' or ".." in an entry's name). */
static int path_is_safe(const char *rel) {
    if (rel[0] == '\0' || rel[0] == '/') return 0;
    for (const char *p = rel; *p;) {
        size_t len = strcspn(p, "/");
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        p += len;
        if (*p == '/') p++;
        if (*p == '\0' && p[-1] == '/') return 0; /* trailing slash: an empty last component */
    }
    return 1;
}

/* Open the folder that will hold `rel`, walking down from `root` one component at a time with
 * O_NOFOLLOW: a symlink extracted earlier (to "/etc", say) is never followed, so nothing is
 * written outside the target whatever the image's symlinks point at. Missing folders are
 * created (a GLOB can select a file without its parents). *leaf gets the last component. */
static int open_parent(int root, char *rel, char **leaf) {
    int fd = dup(root);
    char *slash;
    while (fd >= 0 && (slash = strchr(rel, '/'))) {
        *slash = '\0';
        if (mkdirat(fd, rel, 0755) < 0 && errno != EEXIST) { close(fd); return -1; }
        int next = openat(fd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = next;
        *slash = '/';
        rel = slash + 1;
    }
    *leaf = rel;
    return fd;
}

/* Make room for a new file or symlink: replace what a previous extraction left, but never a
 * folder (an image that has both a folder and a file under one name is refused). */
static int clear_leaf(int dir, const char *leaf) {
    struct stat st;
    if (fstatat(dir, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0) return errno == ENOENT ? 0 : -1;
    if (S_ISDIR(st.st_mode)) { errno = EISDIR; return -1; }
    return unlinkat(dir, leaf, 0);
}

static int write_file(sqfs *fs, sqfs_inode *inode, int dir, const char *leaf, mode_t perm) {
    static char buf[1 << 16];
    if (clear_leaf(dir, leaf) < 0) return -1;
    int out = openat(dir, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (out < 0) return -1;
    for (sqfs_off_t pos = 0; pos < (sqfs_off_t)inode->xtra.reg.file_size;) {
        sqfs_off_t n = sizeof buf;
        if (sqfs_read_range(fs, inode, pos, &n, buf) != SQFS_OK || n <= 0) {
            errno = EIO;
            close(out);
            return -1;
        }
        for (sqfs_off_t done = 0; done < n;) {
            ssize_t w = write(out, buf + done, (size_t)(n - done));
            if (w < 0) { close(out); return -1; }
            done += w;
        }
        pos += n;
    }
    /* the mode is set after writing, so the umask does not change it */
    int rc = fchmod(out, perm);
    return close(out) < 0 ? -1 : rc;
}

static int extract_entry(sqfs *fs, int root, const char *path, sqfs_inode_id id) {
    sqfs_inode inode;
    if (sqfs_inode_get(fs, &inode, id) != SQFS_OK) { errno = EIO; return -1; }
    char rel[PATH_MAX], *leaf;
    if (snprintf(rel, sizeof rel, "%s", path) >= (int)sizeof rel) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int dir = open_parent(root, rel, &leaf);
    if (dir < 0) return -1;
    /* permission bits only: setuid/setgid/sticky bits from an image are not honoured */
    mode_t perm = inode.base.mode & 0777, type = sqfs_mode(inode.base.inode_type) & S_IFMT;
    int rc = 0;
    if (type == S_IFDIR) {
        /* u+rwx always, so the tree can be filled now and deleted later */
        struct stat st;
        if (mkdirat(dir, leaf, 0700) < 0 && errno != EEXIST) rc = -1;
        else if (fstatat(dir, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0) rc = -1;
        else if (!S_ISDIR(st.st_mode)) { errno = ENOTDIR; rc = -1; }
        else rc = fchmodat(dir, leaf, perm | S_IRWXU, 0);
    } else if (type == S_IFREG) {
        rc = write_file(fs, &inode, dir, leaf, perm);
    } else if (type == S_IFLNK) {
        char target[PATH_MAX];
        size_t size = sizeof target;
        if (inode.xtra.symlink_size >= sizeof target ||
            sqfs_readlink(fs, &inode, target, &size) != SQFS_OK) { errno = EIO; rc = -1; }
        else if (clear_leaf(dir, leaf) < 0 || symlinkat(target, dir, leaf) < 0) rc = -1;
    } else {
        /* device nodes, fifos, sockets: an AppDir has no use for them */
        fprintf(stderr, "skipping %s: not a file, folder or symlink\n", path);
    }
    int saved = errno;
    close(dir);
    errno = saved;
    return rc;
}

/* Extract the image (or the entries matching `glob`) into `dest`, created if missing. */
static int extract(const char *self, off_t offset, const char *dest, const char *glob) {
    sqfs fs;
    int fd = open(self, O_RDONLY | O_CLOEXEC), rc = 0;
    if (fd < 0 || sqfs_init(&fs, fd, (size_t)offset) != SQFS_OK) {
        fprintf(stderr, "%s: no squashfs image at offset %lld\n", self, (long long)offset);
        return -1;
    }
    if (mkdir(dest, 0755) < 0 && errno != EEXIST) { perror(dest); return -1; }
    /* O_NOFOLLOW: a squashfs-root symlink planted in a shared folder is not written through */
    int root = open(dest, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    sqfs_traverse trv;
    sqfs_err err = SQFS_OK;
    if (root < 0 || sqfs_traverse_open(&trv, &fs, sqfs_inode_root(&fs)) != SQFS_OK) {
        perror(dest);
        return -1;
    }
    while (rc == 0 && sqfs_traverse_next(&trv, &err)) {
        if (trv.dir_end || (glob && fnmatch(glob, trv.path, 0) != 0)) continue;
        if (!path_is_safe(trv.path)) {
            fprintf(stderr, "refusing to extract \"%s\": it leaves %s\n", trv.path, dest);
            rc = -1;
        } else if (extract_entry(&fs, root, trv.path, trv.entry.inode) < 0) {
            fprintf(stderr, "cannot extract %s: %s\n", trv.path, strerror(errno));
            rc = -1;
        }
    }
    if (err != SQFS_OK) {
        fprintf(stderr, "%s: the squashfs image is damaged\n", self);
        rc = -1;
    }
    sqfs_traverse_close(&trv);
    sqfs_destroy(&fs);
    close(root);
    close(fd);
    return rc;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* ---- running AppRun ------------------------------------------------------------------- */

static volatile pid_t child;

/* TERM and HUP (a service manager, a closed terminal) are passed on to AppRun; INT and QUIT
 * from a terminal already reach AppRun through its process group, so the runtime ignores
 * them and waits to clean up after it. */
static void forward(int sig) {
    if (child > 0) kill(child, sig);
}

/* Run APPDIR/AppRun with `args` and wait; returns its exit status, shell-style for signals. */
static int run_apprun(const char *appdir, const char *self, const char *argv0, int argc,
                      char **args) {
    char apprun[PATH_MAX], owd[PATH_MAX];
    snprintf(apprun, sizeof apprun, "%s/AppRun", appdir);
    /* the spec's variables: what AppRun and the app use to find themselves */
    setenv("APPDIR", appdir, 1);
    setenv("APPIMAGE", self, 1);
    setenv("ARGV0", argv0, 1);
    if (getcwd(owd, sizeof owd)) setenv("OWD", owd, 1);

    char **argv = calloc((size_t)argc + 2, sizeof *argv);
    argv[0] = apprun;
    memcpy(argv + 1, args, (size_t)argc * sizeof *argv);

    struct sigaction pass = {.sa_handler = forward}, ignore = {.sa_handler = SIG_IGN};
    sigaction(SIGTERM, &pass, NULL);
    sigaction(SIGHUP, &pass, NULL);
    sigaction(SIGINT, &ignore, NULL);
    sigaction(SIGQUIT, &ignore, NULL);
    child = fork();
    if (child == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGQUIT, SIG_DFL);
        execv(apprun, argv);
        fprintf(stderr, "cannot run %s: %s\n", apprun, strerror(errno));
        _exit(127);
    }
    free(argv);
    if (child < 0) { perror("fork"); return 1; }
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) return 1;
    child = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *temp_dir(const char *prefix) {
    const char *tmp = getenv("TMPDIR");
    char *dir;
    if (asprintf(&dir, "%s/%sXXXXXX", tmp && *tmp ? tmp : "/tmp", prefix) < 0) return NULL;
    if (mkdtemp(dir)) return dir;
    perror(dir);
    free(dir);
    return NULL;
}

static int extract_and_run(const char *self, off_t offset, const char *argv0, int argc,
                           char **args) {
    char *dir = temp_dir("appimage_extracted_");
    if (!dir) return 1;
    int rc = extract(self, offset, dir, NULL) < 0 ? 1
                                                  : run_apprun(dir, self, argv0, argc, args);
    nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
    return rc;
}

/* ---- running from a FUSE mount -------------------------------------------------------- */

static void *serve(void *session) {
    fuse_session_loop(session);
    return NULL;
}

/* Mount the image read-only on a private folder, served by squashfuse's low-level ops from a
 * thread of this process, run AppRun from it, then unmount. Returns -1 if FUSE is refused. */
static int mount_and_run(const char *self, off_t offset, const char *argv0, int argc,
                         char **args) {
    sqfs_ll *ll = sqfs_ll_open(self, (size_t)offset);
    if (!ll) return 1;
    struct fuse_lowlevel_ops ops = {
        .getattr = sqfs_ll_op_getattr,   .opendir = sqfs_ll_op_opendir,
        .releasedir = sqfs_ll_op_releasedir, .readdir = sqfs_ll_op_readdir,
        .lookup = sqfs_ll_op_lookup,     .open = sqfs_ll_op_open,
        .create = sqfs_ll_op_create,     .release = sqfs_ll_op_release,
        .read = sqfs_ll_op_read,         .readlink = sqfs_ll_op_readlink,
        .listxattr = sqfs_ll_op_listxattr, .getxattr = sqfs_ll_op_getxattr,
        .forget = sqfs_ll_op_forget,     .statfs = stfs_ll_op_statfs,
    };
    char *mnt = temp_dir(".mount_");
    if (!mnt) return 1;
    struct fuse_args fargs = FUSE_ARGS_INIT(0, NULL);
    fuse_opt_add_arg(&fargs, argv0);
    fuse_opt_add_arg(&fargs, "-o");
    fuse_opt_add_arg(&fargs, "ro,nodev,nosuid,subtype=appimage");
    sqfs_ll_chan ch;
    if (sqfs_ll_mount(&ch, mnt, &fargs, &ops, sizeof ops, ll) != SQFS_OK) {
        rmdir(mnt);
        free(mnt);
        fuse_opt_free_args(&fargs);
        return -1;
    }
    pthread_t server;
    pthread_create(&server, NULL, serve, ch.session);
    int rc = run_apprun(mnt, self, argv0, argc, args);
    /* unmounting ends the loop (its read of /dev/fuse fails); if AppRun left a process using
     * the mount, the unmount is lazy and the loop serves it until it lets go */
    fuse_session_exit(ch.session);
    fuse_session_unmount(ch.session);
    pthread_join(server, NULL);
    fuse_session_destroy(ch.session);
    rmdir(mnt);
    free(mnt);
    fuse_opt_free_args(&fargs);
    sqfs_ll_destroy(ll);
    free(ll);
    return rc;
}

/* ---- main ----------------------------------------------------------------------------- */

static const char HELP[] =
    "AppImage options (the rest are passed to the app):\n"
    "  --appimage-extract [GLOB]   extract the contents (or what matches GLOB) to ./squashfs-root\n"
    "  --appimage-extract-and-run  extract to a temporary folder, run, and delete it (no FUSE)\n"
    "  --appimage-offset           print the offset of the squashfs image in this file\n"
    "  --appimage-version          print the runtime's version\n"
    "  --appimage-help             this help\n";

int main(int argc, char **argv) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) { perror("/proc/self/exe"); return 1; }
    self[n] = '\0';
    off_t offset = elf_end(self);
    if (offset <= 0) {
        fprintf(stderr, "%s: not a 64-bit ELF, cannot find the image\n", self);
        return 1;
    }
    const char *opt = argc > 1 ? argv[1] : "";
    const char *env = getenv("APPIMAGE_EXTRACT_AND_RUN");

    if (strcmp(opt, "--appimage-offset") == 0) {
        printf("%lld\n", (long long)offset);
        return 0;
    }
    if (strcmp(opt, "--appimage-version") == 0) {
        printf("%s\n", RUNTIME_VERSION);
        return 0;
    }
    if (strcmp(opt, "--appimage-help") == 0) {
        fputs(HELP, stdout);
        return 0;
    }
    if (strcmp(opt, "--appimage-extract") == 0) {
        if (extract(self, offset, "squashfs-root", argc > 2 ? argv[2] : NULL) < 0) return 1;
        puts("squashfs-root");
        return 0;
    }
    if (strcmp(opt, "--appimage-extract-and-run") == 0)
        return extract_and_run(self, offset, argv[0], argc - 2, argv + 2);
    if (strncmp(opt, "--appimage-", 11) == 0) {
        fprintf(stderr, "unknown option %s\n%s", opt, HELP);
        return 1;
    }
    if (env && strcmp(env, "1") == 0)
        return extract_and_run(self, offset, argv[0], argc - 1, argv + 1);

    int rc = mount_and_run(self, offset, argv[0], argc - 1, argv + 1);
    if (rc == -1) {
        fprintf(stderr,
                "%s: cannot mount the AppImage with FUSE (it needs /dev/fuse, permission to mount, "
                "and fusermount3 from the fuse3 package).\n"
                "Run it without FUSE: %s --appimage-extract-and-run [ARGS]\n"
                "or extract it once:  %s --appimage-extract\n",
                argv[0], argv[0], argv[0]);
        return 1;
    }
    return rc;
}

/* libsquashfuse.a calls an LZO decoder for LZO-compressed images. liblzo2 is GPL-2 and rarely
 * installed, and our images are zstd (build_appdir.py), so LZO images are refused instead of
 * linking it: squashfuse reports the failed block as an I/O error. */
int lzo1x_decompress_safe(const unsigned char *src, unsigned long src_len, unsigned char *dst,
                          unsigned long *dst_len, void *wrkmem) {
    (void)src, (void)src_len, (void)dst, (void)dst_len, (void)wrkmem;
    fputs("this AppImage runtime does not read LZO-compressed images\n", stderr);
    return -1; /* LZO_E_ERROR */
}
